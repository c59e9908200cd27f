"""Bounded JSON numbers (structured/numbers.py): the bounds themselves, and the mask they
put on a grammar's, with the fixture tokenizer and llguidance."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar
from mlxserve.structured.numbers import fits, room


@pytest.mark.parametrize(
    ("text", "integer", "allowed"),
    [
        (b"9223372036854775807", True, True),
        (b"9223372036854775808", True, False),
        (b"-9223372036854775808", True, True),
        (b"-9223372036854775809", True, False),
        (b"9" * 17, False, True),
        (b"9" * 18, False, False),
        (b"9" * 17 + b".", False, False),  # no room for the fraction's digit
        (b"1234567890.1234567", False, True),
        (b"1234567890.12345678", False, False),
        (b"0.00000000000000000123", False, True),  # 17 zeros, then significant digits
        (b"0.000000000000000000123", False, False),  # 18 zeros
        (b"100000000000000000", False, False),  # trailing zeros of an integer count
        (b"1.5e308", False, True),
        (b"1.8e308", False, False),  # past a float64: inf
        (b"1e-999", False, True),  # as small as it likes: it reads as 0.0
        (b"1e1000", False, False),
        (b"1e", False, True),
        (b"-", True, True),
        (b"01", False, True),  # not a number: the grammar refuses it, not the bounds
    ],
)
def test_what_the_bounds_allow(text, integer, allowed):
    assert fits(text, integer) is allowed


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def allowed_after(tokenizer, grammar: Grammar, text: str) -> set[str]:
    """The tokens (as text) the grammar's processor allows after `text`."""
    processor = grammar.processor()
    tokens = tokenizer.encode(text, add_special_tokens=False)
    logits = mx.zeros((1, len(tokenizer.vocab)))
    processor(mx.array([0]), logits)
    for token in tokens:
        masked = processor(mx.array([token]), logits)
    allowed = np.flatnonzero(np.isfinite(np.array(masked[0])))
    return {tokenizer.decode([int(t)]) for t in allowed}


def json_grammar(tokenizer, schema: dict) -> Grammar:
    return Grammar(tokenizer, lark.grammar(lark.json_schema(schema)))


def test_any_json_object_holds_a_float64(tokenizer):
    grammar = json_grammar(tokenizer, {"type": "object"})
    assert {"9", ".", "e"} <= allowed_after(tokenizer, grammar, '{"a": 9999')
    after = allowed_after(tokenizer, grammar, '{"a": ' + "9" * 17)
    assert "e" in after and "}" in after
    assert not {"9", "."} & after
    assert not set("0123456789") & allowed_after(tokenizer, grammar, '{"a": 9e999')
    assert "9" in allowed_after(tokenizer, grammar, '{"a": "' + "9" * 40)  # a string


def test_an_integer_holds_an_int64(tokenizer):
    grammar = json_grammar(tokenizer, {"type": "integer"})
    assert set("0123456789") <= allowed_after(tokenizer, grammar, "92233720368547758")
    after = allowed_after(tokenizer, grammar, "922337203685477580")
    assert set("01234567") <= after and not {"8", "9"} & after
    assert not set("0123456789") & allowed_after(tokenizer, grammar, "9223372036854775807")


def test_a_schema_that_needs_more_digits_gets_them(tokenizer):
    """The grammar wins over the bounds: here only a uint64 past the int64s is valid."""
    grammar = json_grammar(tokenizer, {"const": 18000000000000000000})
    assert allowed_after(tokenizer, grammar, "1" + "8" + "0" * 17) == {"0"}


def test_other_grammars_are_left_alone(tokenizer):
    grammar = Grammar(tokenizer, lark.grammar(lark.regex("[0-9]{40}")))
    assert "9" in allowed_after(tokenizer, grammar, "9" * 30)


@pytest.mark.parametrize("longest", [1, 2, 3])
@pytest.mark.parametrize(
    "text", [b"1", b"-0", b"0.000", b"1" * 14, b"1" * 15, b"1" * 16, b"9.9", b"1e", b"1e9", b"1E-9"]
)
def test_room_means_every_continuation_fits(text, longest):
    """`room` lets a step skip the per-token look: it must never skip one that would refuse."""
    if not room(text, longest):
        return
    for size in range(1, longest + 1):
        for suffix in itertools.product(b"09.eE+-", repeat=size):
            assert fits(text + bytes(suffix), integer=True)
            assert fits(text + bytes(suffix), integer=False)


def test_room_is_there_far_from_the_bounds():
    assert room(b"123", 2) and room(b"1.5e1", 1)
    assert not room(b"1" * 16, 2) and not room(b"1e12", 1)

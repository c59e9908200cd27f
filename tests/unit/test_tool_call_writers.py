"""Every tool-call format's writer against its own parser, with no model: random walks
through the grammar of a call (each step a token drawn at random among those the grammar
allows) must always give calls the post-processor reads back, to tools among the request's,
whose arguments validate against the tool's schema; the recorded sample of each format (what
its models write) is a text the grammar accepts."""

from __future__ import annotations

import functools
import json
import random

import jsonschema
import mlx.core as mx
import numpy as np
import parser_checks
import pytest
from conversations import WEATHER_TOOL
from helpers.tools import TRIP
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tool_samples import SAMPLES

from mlxserve.postprocess import tools
from mlxserve.postprocess.parser import OutputParser
from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar, ll_tokenizer, markup_lark

WRITERS = sorted(name for name, f in tools.FORMATS.items() if f.traits.forced_call)
PING = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [TRIP, PING]
SCHEMAS = {t["function"]["name"]: lark.parameters(t) for t in TOOLS}
# Muse Spark's parser reads a value as JSON where it can: strings are written as JSON
# strings, so its models' raw "Paris" is not what the writer writes.
RAW_STRING_SAMPLES = {"muse_spark"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def grammar(tokenizer, name: str, tool_list: list[dict], parallel: bool) -> Grammar:
    fmt = tools.FORMATS[name]
    markup = functools.partial(markup_lark, tokenizer)
    body, rules = fmt.traits.forced_call(markup, fmt.start, fmt.end, tool_list, parallel)
    return Grammar(tokenizer, lark.grammar(body, rules=rules))


def walk(tokenizer, compiled: Grammar, seed: int, steps: int = 2000) -> str:
    """A reply the grammar allows, each token drawn at random among the allowed ones (where
    it may end, it ends one time in two)."""
    rng = random.Random(seed)
    processor = compiled.processor()
    tokens = [0]
    ends = set(tokenizer.eos_token_ids)
    vocab = ll_tokenizer(tokenizer).vocab_size
    for _ in range(steps):
        allowed = processor(mx.array(tokens), mx.zeros((1, vocab)))
        choices = np.flatnonzero(np.isfinite(np.array(allowed[0])))
        if ends & set(choices.tolist()) and (set(choices.tolist()) <= ends or rng.random() < 0.5):
            return tokenizer.decode(tokens[1:])
        token = int(rng.choice([c for c in choices.tolist() if c not in ends] or choices))
        tokens.append(token)
    raise AssertionError(f"no end after {steps} tokens: {tokenizer.decode(tokens[1:])!r}")


@pytest.mark.parametrize("name", WRITERS)
def test_random_calls_are_read_back_valid(tokenizer, name):
    for parallel in (True, False):
        compiled = grammar(tokenizer, name, TOOLS, parallel)
        for seed in range(12):
            text = walk(tokenizer, compiled, seed)
            options = {"tool_format": tools.by_name(name), "tools": TOOLS}
            out = parser_checks.run(OutputParser, [text], **options)
            assert out["content"] == "" and out["calls"], (text, out)
            assert parallel or len(out["calls"]) == 1, (text, out)
            for call_name, arguments in out["calls"]:
                jsonschema.validate(json.loads(arguments), SCHEMAS[call_name])


@pytest.mark.parametrize("name", sorted(set(WRITERS) - RAW_STRING_SAMPLES))
def test_what_the_models_write_is_allowed(tokenizer, name):
    matcher = grammar(tokenizer, name, [WEATHER_TOOL], False).processor()._matcher
    assert matcher.consume_tokens(tokenizer.encode(SAMPLES[name], add_special_tokens=False))
    assert matcher.is_accepting()

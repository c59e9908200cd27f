"""Logits processors that follow drafted tokens (engine/speculation/verify.py shows them a draft
one position at a time, then takes back what the pass did not keep; engine/speculation/draft_guide.py
shows them a drafter's guesses, then takes them all back): after `rollback` each one masks
the next token exactly as one that never saw the rejected tokens."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxserve.engine.generation.reasoning_budget import ReasoningBudget
from mlxserve.engine.speculation.draft_guide import DraftGuide
from mlxserve.structured import lark
from mlxserve.structured.matcher import Grammar

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "number"}, "s": {"type": "string"}},
    "required": ["n", "s"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def shown(processor, tokens: list[int], vocab: int) -> list[np.ndarray]:
    """Show `processor` the tokens one call each, as a decode does (the first is the
    prompt's last token); the tokens each call left allowed."""
    masks = []
    for end in range(1, len(tokens) + 1):
        logits = processor(mx.array(tokens[:end]), mx.zeros((1, vocab)))
        masks.append(np.isfinite(np.array(logits[0])))
    return masks


def encoded(tokenizer, *texts: str) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def after_rollback(speculating, plain, kept, drafted, then, vocab):
    """Show `speculating` the kept tokens and the draft, take the draft back, and show it
    `then`; show `plain` the kept tokens and `then`: each one's masks at `then`."""
    shown(speculating, [*kept, *drafted], vocab)
    speculating.rollback(len(drafted))
    got = [shown_once(speculating, [*kept, *then[: i + 1]], vocab) for i in range(len(then))]
    return got, [m.tolist() for m in shown(plain, [*kept, *then], vocab)[len(kept) :]]


def shown_once(processor, tokens: list[int], vocab: int) -> list[bool]:
    logits = processor(mx.array(tokens), mx.zeros((1, vocab)))
    return np.isfinite(np.array(logits[0])).tolist()


@pytest.mark.parametrize(
    ("kept", "drafted", "then"),
    [
        ('{"n": 12', '345, "s": "x', "6"),  # drafts the grammar allows, rejected
        # 17 significant digits is all a number may carry: the bounds must forget the
        # drafted digits, or they would refuse the 17th
        ('{"n": 1234567890123456', "789", "7"),
        ('{"n": 1', '}}} "', ","),  # a draft the grammar refuses
    ],
    ids=["allowed", "number-bounds", "refused"],
)
def test_a_grammar_rolls_back_to_the_kept_tokens(tokenizer, kept, drafted, then):
    grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(SCHEMA)))
    assert_rolled_back(tokenizer, grammar, kept, drafted, then)


def assert_rolled_back(tokenizer, grammar: Grammar, kept: str, drafted: str, then: str):
    """After a reply `kept`, drafted tokens taken back: `then` is masked as if never drafted."""
    prompt = tokenizer.encode("x", add_special_tokens=False)
    kept_ids, drafted_ids, then_ids = encoded(tokenizer, kept, drafted, then)
    got, expected = after_rollback(
        grammar.processor(),
        grammar.processor(),
        [*prompt, *kept_ids],
        drafted_ids,
        then_ids,
        len(tokenizer.get_vocab()),  # with the added tokens: the call opening is one
    )
    assert got == expected


def test_positions_after_a_refused_draft_token_allow_only_the_ends(tokenizer):
    grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(SCHEMA)))
    lead, refused, after = encoded(tokenizer, 'x{"n": 1', "]", "1")
    masks = shown(grammar.processor(), [*lead, *refused, *after], len(tokenizer.vocab))
    ends = sorted(tokenizer.eos_token_ids)
    assert len(np.flatnonzero(masks[len(lead) - 1])) > len(ends)
    assert [np.flatnonzero(m).tolist() for m in masks[len(lead) :]] == [ends, ends]


@pytest.mark.parametrize("drafted", [[1, 1], [8, 9, 1], [1, 8]])
def test_a_reasoning_budget_rolls_back_to_the_kept_tokens(drafted):
    """Budget 3, reasoning opened by the prompt and closed by tokens 8, 9: drafted tokens
    spend the budget or close the reasoning; taken back, they do neither."""
    budget = ReasoningBudget(3, opening=(7,), closing=(8, 9), opened=True)
    kept = [0, 1, 1]  # the prompt's last token, then two of reasoning
    got, expected = after_rollback(
        budget.processor(), budget.processor(), kept, drafted, [1, 8], 10
    )
    # the third token of reasoning spends the budget: the closing tokens are forced
    assert expected == [[t == 8 for t in range(10)], [t == 9 for t in range(10)]]
    assert got == expected


@dataclass
class Rows:
    """What a DraftGuide reads of a speculative batch: its rows' processors, the tokens
    they have seen and their next tokens (and the model's vocabulary, its logprobs' width)."""

    logits_processors: list[list]
    seen: list[list[int]]
    nexts: list[int]
    vocab: int

    @property
    def next_tokens(self) -> mx.array:
        return mx.array(self.nexts)

    @property
    def next_logprobs(self) -> list[mx.array]:
        return [mx.zeros((self.vocab,)) for _ in self.nexts]

    def tokens_seen(self, row: int) -> mx.array:
        return mx.array(self.seen[row])


@pytest.mark.parametrize("padding", [5, 0, -3], ids=["wider", "same", "narrower"])
def test_a_drafters_guesses_follow_the_grammar_and_are_taken_back(tokenizer, padding):
    """engine/speculation/draft_guide.py: a drafter (its vocabulary padded wider or narrower than the
    model's) that prefers letters guesses, for a row under a `[0-9]{4}` grammar, the
    digits it allows, each after the guesses before it, and for a row beside it without
    one, its letters; once done, the grammar masks each token as one that never saw the
    guesses."""
    vocab = len(tokenizer.vocab)
    grammar = Grammar(tokenizer, lark.grammar(lark.regex("[0-9]{4}")))
    speculating, plain = grammar.processor(), grammar.processor()
    prompt = tokenizer.encode("x", add_special_tokens=False)
    (one,) = encoded(tokenizer, "1")
    for processor in (speculating, plain):
        shown(processor, prompt, vocab)  # the row's first token's mask, as a decode
    guide = DraftGuide(Rows([[speculating], []], [prompt, prompt], [one[0], one[0]], vocab))
    letter = tokenizer.convert_tokens_to_ids("a")
    digits = tokenizer.convert_tokens_to_ids(["3", "5"])
    preferred = mx.zeros((2, vocab + padding)).at[:, letter].add(9.0)
    guesses = [guide.choose(preferred.at[:, digit].add(5.0)).tolist() for digit in digits]
    guide.done()
    assert guesses == [[digit, letter] for digit in digits]
    then = [*prompt, one[0], *digits]
    calls = range(len(prompt) + 1, len(then) + 1)  # the next token, then each guess
    assert [shown_once(speculating, then[:k], vocab) for k in calls] == [
        shown_once(plain, then[:k], vocab) for k in calls
    ]


@pytest.mark.parametrize(
    ("kept", "drafted", "then"),
    [
        ("Sure.", '<tool_call>\n{"name": "f', "\n"),  # a drafted opening taken back: free
        ('Sure.<tool_call>\n{"name": "f", "arguments": {"n": 1', '2, "s', "}"),  # inside
        ("Sure.<tool_call>", '\n{"', "\n"),  # back to just after the opening
        ("Sure", ". Then", " more"),  # no opening anywhere
    ],
    ids=["opening-drafted", "inside-the-call", "after-the-opening", "free"],
)
def test_a_call_guide_rolls_back_to_the_kept_tokens(tokenizer, kept, drafted, then):
    """Under tool_choice auto: free text, then the call's grammar from its opening on."""
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    body = lark.json_schema(lark.any_of([lark.tool_call_object(tool)]))
    grammar = Grammar(
        tokenizer,
        lark.grammar(f'<[{tokenizer.encode("<tool_call>")[0]}]> "\\n" {body}'),
        trigger="<tool_call>",
    )
    assert_rolled_back(tokenizer, grammar, kept, drafted, then)


@pytest.mark.parametrize(
    ("kept", "drafted", "then"),
    [
        ("Sure [TOOL", '_CALLS]{"n', '{"'),  # the opening's end drafted, taken back
        ('Sure [TOOL_CALLS]{"n": 1', '2, "s', ","),  # inside the call
        ("Sure [TOOL_CALLS]", '{"n', "{"),  # back to just after the opening
    ],
    ids=["opening-drafted", "inside-the-call", "after-the-opening"],
)
def test_a_call_guide_with_an_opening_of_several_tokens_rolls_back(tokenizer, kept, drafted, then):
    """An opening in plain text: the token that finishes it is read at once, and the
    next one is masked."""
    grammar = Grammar(
        tokenizer,
        lark.grammar(f'"[TOOL_CALLS]" {lark.json_schema(SCHEMA)}'),
        trigger="[TOOL_CALLS]",
    )
    assert_rolled_back(tokenizer, grammar, kept, drafted, then)
    masks = shown(grammar.processor(), encoded(tokenizer, "x Sure [TOOL_CALLS]")[0], 4096)
    assert not masks[-1][tokenizer.encode("[", add_special_tokens=False)[0]]  # JSON next

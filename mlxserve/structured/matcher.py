"""llguidance for MLX: grammars compiled against a model's tokenizer, and the logits
processor that masks what a grammar does not allow next.

llguidance computes the mask of allowed tokens on the CPU (tens of microseconds a token);
the mask is applied with `mx.where`, so the same code runs on Metal, CUDA and CPU
(llguidance's own MLX helper is a Metal-only kernel).
"""

from __future__ import annotations

import functools
import json
import logging
import re

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from mlxserve.compat import hf_tokenizer
from mlxserve.structured.call_guide import CallGuideProcessor, OneTokenOpening
from mlxserve.structured.numbers import NumberBounds, NumberTable
from mlxserve.structured.token_table import VocabularyTable
from mlxserve.values import as_int

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)  # per tokenizer: building it walks the whole vocabulary
def ll_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of an mlx-lm tokenizer; every end-of-turn token ends a grammar.
    llguidance reads tokenizer.json itself where it knows the decoder; other tokenizers
    (a Metaspace decoder, no tokenizer.json) get a token table built from the vocabulary."""
    ends = sorted(tokenizer.eos_token_ids)
    try:
        return llguidance.hf.from_tokenizer(hf_tokenizer(tokenizer), eos_token=ends)
    except (ValueError, RuntimeError) as e:
        log.info("Building the grammar token table from the vocabulary (%s)", e)
        table = VocabularyTable.of(tokenizer)
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(table), eos_token=ends)


@functools.lru_cache(maxsize=8)  # per tokenizer: building it walks the whole vocabulary
def token_texts(tokenizer) -> list[bytes]:
    """Each token's bytes as the grammar engine reads them (special tokens: their text)."""
    ll = ll_tokenizer(tokenizer)
    return [ll.decode_bytes([token]) for token in range(ll.vocab_size)]


@functools.lru_cache(maxsize=8)
def number_table(tokenizer) -> NumberTable:
    return NumberTable.of(token_texts(tokenizer))


def markup_lark(tokenizer, text: str) -> str:
    """A Lark expression for exactly the tokens of `text`: special tokens (which grammar
    text can never match) by id, the rest as quoted text."""
    ll = ll_tokenizer(tokenizer)
    parts: list[str] = []
    pending: list[int] = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        if ll.is_special_token(token):
            if pending:
                parts.append(json.dumps(tokenizer.decode(pending)))
                pending = []
            parts.append(f"<[{token}]>")
        else:
            pending.append(token)
    if pending:
        parts.append(json.dumps(tokenizer.decode(pending)))
    return " ".join(parts)


def is_special(tokenizer, text: str) -> bool:
    """Whether `text` is a single special token."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    return len(tokens) == 1 and ll_tokenizer(tokenizer).is_special_token(tokens[0])


class GrammarError(ValueError):
    """The grammar engine refused a grammar; the message says what it cannot do."""


class Grammar:
    """A grammar compiled for one tokenizer; each generated sequence follows its own copy.
    With a `trigger` (a tool-call format's opening) it guides calls under `auto`: the reply
    follows it from that opening on (see call_guide.py)."""

    def __init__(
        self,
        tokenizer,
        lark: str,
        bounded_numbers: bool = True,
        trigger: str | None = None,
    ):
        self.lark = lark  # the source: other ranks of a distributed server compile it too
        self.trigger = trigger
        self._first_masks: dict[int, mx.array] = {}
        self._tokenizer = tokenizer
        ll = self._ll = ll_tokenizer(tokenizer)
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, ll)
        matcher = llguidance.LLMatcher(ll, grammar) if not failed else None
        if matcher is None or matcher.is_error():
            raise GrammarError(failure_message(messages, matcher))
        self._matcher = matcher
        self._vocab_size = ll.vocab_size
        self._ends = sorted(tokenizer.eos_token_ids)
        # Wherever the grammar writes JSON, its numbers are bounded (see numbers.py); the
        # benchmark turns that off to compare.
        bounded = bounded_numbers and "%json" in lark
        self._numbers = number_table(tokenizer) if bounded else None

    def processor(self) -> GrammarProcessor | CallGuideProcessor:
        if self.trigger is None:
            return self._processor()
        texts = token_texts(self._tokenizer)
        opening = self._ll.tokenize_str(self.trigger)
        one = OneTokenOpening(opening[0], self._after_opening) if len(opening) == 1 else None
        return CallGuideProcessor(self.trigger, texts, self._begun, one)

    def _after_opening(self, width: int) -> mx.array:
        """What the grammar allows right after its one-token opening, over `width` logits
        (the same for every sequence: computed once)."""
        if width not in self._first_masks:
            assert self.trigger is not None
            processor = self._begun(self.trigger.encode())
            assert processor is not None, "a guide's grammar begins with its opening"
            masked = processor(mx.array([0]), mx.zeros((1, width)))
            self._first_masks[width] = mx.isfinite(masked[0])
        return self._first_masks[width]

    def _processor(self) -> GrammarProcessor:
        numbers = NumberBounds(self._numbers) if self._numbers is not None else None
        return GrammarProcessor(self._matcher.deep_copy(), self._vocab_size, self._ends, numbers)

    def _begun(self, text: bytes) -> GrammarProcessor | None:
        """A processor having read `text` (the reply from the call opening on); None where
        the grammar does not allow it."""
        processor = self._processor()
        return processor if processor.begin(self._ll.tokenize_bytes(text)) else None


class GrammarProcessor:
    """An mlx-lm logits processor: each call feeds the token generated since the last call
    to the matcher, then masks every token the grammar does not allow next. Once the
    grammar is complete only end-of-turn tokens remain.

    A speculative pass calls it once per position, each call with one more drafted token,
    and `rollback` then takes back the drafted tokens the pass did not keep (llguidance's
    matchers roll back). A drafted token the grammar does not allow is refused, not fed:
    it, and every position after it, allow only end-of-turn tokens (the sampler at the
    position before never picks a refused token, so none of them is ever kept)."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        vocab_size: int,
        ends: list[int],
        numbers: NumberBounds | None = None,
    ):
        self._matcher = matcher
        self._numbers = numbers
        self._calls = 0
        self._bitmask = allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size
        self._ends = ends
        self._allowed: np.ndarray | None = None
        self._refused = 0  # the last tokens seen that were not fed (none, or a draft's tail)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._calls:  # the first call sees the prompt's last token, not a generated one
            self._follow(as_int(tokens[-1]))
        self._calls += 1
        if self._allowed is None:  # the model's vocabulary may be padded past the tokenizer's
            self._allowed = np.zeros(logits.shape[-1], dtype=np.bool_)
            self._vocab_size = min(self._vocab_size, logits.shape[-1])
        if self._refused or self._matcher.is_error():  # only past a draft's refused token
            self._allowed[:] = False
            self._allowed[self._ends] = True
        else:
            fill_next_token_bitmask(self._matcher, self._bitmask)
            bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
            self._allowed[: self._vocab_size] = bits[: self._vocab_size]
            if self._numbers is not None:
                self._numbers.restrict(self._allowed)
        return mx.where(mx.array(self._allowed), logits, -mx.inf)

    def begin(self, tokens: list[int]) -> bool:
        """Read `tokens` (written before this processor took over), as if each had been
        generated under it; False where the grammar refuses one."""
        if self._matcher.try_consume_tokens(tokens) < len(tokens):
            return False
        if self._numbers is not None:
            for token in tokens:
                self._numbers.written(token)
        return True

    def _follow(self, token: int) -> None:
        if self._refused or self._matcher.try_consume_tokens([token]) == 0:
            self._refused += 1
        elif self._numbers is not None:
            self._numbers.written(token)

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` seen (drafted tokens a pass did not keep)."""
        refused = min(tokens, self._refused)
        self._refused -= refused
        fed = tokens - refused
        if fed:
            self._matcher.rollback(fed)
            if self._numbers is not None:
                self._numbers.rollback(fed)


def failure_message(messages: list[str], matcher) -> str:
    """The engine's complaint on one line, without its position in our own Lark text."""
    text = matcher.get_error() if matcher is not None and matcher.is_error() else ""
    text = text or next(iter(messages), "") or "the grammar cannot be compiled"
    text = text.split("<backtrace>")[0]  # a panic's stack is for the engine's developers
    lines = []
    for line in text.splitlines():
        if not re.match(r"\s*(\d+ \||\^)", line):  # not a quote of our grammar source
            lines.append(line.strip())
    return re.sub(r"^at \d+\(\d+\): ", "", " ".join(filter(None, lines)))

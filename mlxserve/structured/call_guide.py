"""Tool calls guided under `tool_choice: "auto"`: the reply is free (text, reasoning)
until it writes its format's call opening; from there on it follows the grammar of valid
calls (tool names among the request's, arguments to each tool's schema, then the end of the
reply). llama.cpp's lazy grammars work the same way. An opening inside reasoning starts the
grammar too: the post-processor reads a call there as a call.

Until the opening nothing waits on the device: the processor reads each token one step
late (by then it has been computed; reading the newest would stall the step being built),
and where the opening is one token (as in the models' own tokenizers) the step after it is
masked on the device, by the grammar's first mask, whatever the token turns out to be. An
opening written as several tokens is guided from the token after the next one on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from mlxserve.values import as_int


class Guide(Protocol):
    """A grammar's processor (`matcher.GrammarProcessor`)."""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array: ...

    def rollback(self, tokens: int) -> None: ...


@dataclass(frozen=True)
class OneTokenOpening:
    """A call opening that is a single token, and the tokens the grammar allows right
    after it (`allowed(width)`: a bool mask over a `width`-wide vocabulary)."""

    token: int
    allowed: Callable[[int], mx.array]


class CallGuideProcessor:
    """An mlx-lm logits processor (one per sequence): free until the call `opening`, then
    the calls' grammar. `start(text)` gives the grammar's processor having read `text` (the
    reply from the opening on), or None where the grammar cannot continue it: that call
    stays free, and `failed` says so.

    A speculative pass shows it drafted tokens one position at a time; `rollback` takes
    back those the pass did not keep, free again where the opening was among them."""

    def __init__(
        self,
        opening: str,
        texts: list[bytes],
        start: Callable[[bytes], Guide | None],
        one_token: OneTokenOpening | None,
    ):
        self._opening = opening.encode()
        self._texts = texts
        self._start = start
        self._one_token = one_token
        self._tails = [b""]  # after each token followed: the text that may begin an opening
        self._pending: mx.array | None = None  # the last token shown, not yet followed
        self._calls = 0
        self._guide: Guide | None = None
        self._guide_calls = 0  # the guide reads a token on each call but its first
        self._opened = False  # the last token followed finished the opening (taken back to)
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._guide is None:
            opened = self._opened or (
                self._pending is not None and self._follow(as_int(self._pending))
            )
            # the first call sees the prompt's last token, not a generated one
            self._pending = tokens[-1] if self._calls else None
            if self._pending is not None:  # queued before the step being built: ready then
                mx.async_eval(self._pending)
            self._calls += 1
            if opened:
                self._wake(tokens)
            if self._guide is None:
                return self._free(tokens, logits)
        self._guide_calls += 1
        return self._guide(tokens, logits)

    def _free(self, tokens: mx.array, logits: mx.array) -> mx.array:
        one = self._one_token
        if one is None:
            return logits
        allowed = mx.logical_or(one.allowed(logits.shape[-1]), tokens[-1] != one.token)
        return mx.where(allowed, logits, -mx.inf)

    def _follow(self, token: int) -> bool:
        """Read a token one step late: whether the opening is now written (the last tail
        is then the text from the opening on)."""
        window = self._tails[-1] + self._text(token)
        at = window.find(self._opening)
        keep = len(self._opening) - 1
        self._tails.append(window[max(len(window) - keep, 0) :] if at < 0 else window[at:])
        return at >= 0

    def _wake(self, tokens: mx.array) -> None:
        """The opening is written: the guide reads it and the token after it (shown now,
        read at once: from here on the call is constrained token by token)."""
        self._guide = self._start(self._tails[-1] + self._text(as_int(tokens[-1])))
        self._guide_calls = 0
        self._opened = False
        if self._guide is None:  # the text after the opening does not fit: free again
            self.failed = True
            self._tails[-1] = self._tails[-1][len(self._opening) :]
        else:
            self._pending = None  # the guide has read it

    def _text(self, token: int) -> bytes:
        return self._texts[token] if token < len(self._texts) else b""

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` shown (drafted tokens a pass did not keep)."""
        if self._guide is not None:
            read = max(self._guide_calls - 1, 0)  # tokens the guide read after its start
            self._guide.rollback(min(tokens, read))
            self._guide_calls -= min(tokens, read)
            if tokens <= read:
                return
            tokens -= read + 1  # with the token read with the opening: free again
            self._guide = None
            self._pending = None
            self._opened = tokens == 0  # the opening is kept: the guide starts again
        elif tokens and self._pending is not None:
            self._pending = None
            tokens -= 1
        if tokens:
            del self._tails[-tokens:]

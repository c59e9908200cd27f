"""Tool calls guided under `tool_choice: "auto"`: the reply is free (text, reasoning)
until it writes its format's call opening; from there on it follows the grammar of valid
calls (tool names among the request's, arguments to each tool's schema, then the end of the
reply). llama.cpp's lazy grammars work the same way. An opening inside reasoning starts the
grammar too: the post-processor reads a call there as a call.

Until the opening nothing waits on the device: the processor reads each token one step
late (by then it has been computed; reading the newest would stall the step being built).
Where the opening is one token (as in the models' own tokenizers) the step after it is
masked on the device, by the grammar's first mask, whatever the token turns out to be; where
it is several tokens, a token is read at once while the text ends with a start of the
opening (rare in text), so the token after the opening is masked either way."""

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

    Each token shown is read a call late, unless the call is open or may be opening (the
    text so far ends with a start of a several-token opening): then at once. A speculative
    pass shows it drafted tokens one position at a time; `rollback` takes back those the
    pass did not keep, free again where the opening was among them."""

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
        # after each token read: the text that may begin an opening, or (once the opening
        # is written) the text from the opening on
        self._tails = [b""]
        self._pending: mx.array | None = None  # the last token shown, not read yet
        self._calls = 0
        self._guide: Guide | None = None
        self._guide_calls = 0  # the guide reads a token on each call but its first
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._guide is None:
            if self._pending is not None:  # evaluated with the last step: no wait
                self._read(as_int(self._pending))
                self._pending = None
            shown = tokens[-1] if self._calls else None  # the first: the prompt's last
            self._calls += 1
            if shown is not None and (self._open() or self._opening_begun()):
                self._read(as_int(shown))
                if self._open():
                    self._wake()
            elif shown is not None:
                self._pending = shown  # mlx-lm evaluates it before the next step
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

    def _read(self, token: int) -> None:
        window = self._tails[-1] + (self._texts[token] if token < len(self._texts) else b"")
        at = window.find(self._opening)
        keep = len(self._opening) - 1
        self._tails.append(window[max(len(window) - keep, 0) :] if at < 0 else window[at:])

    def _open(self) -> bool:
        """Whether the text read so far holds the opening."""
        return self._tails[-1].startswith(self._opening)

    def _opening_begun(self) -> bool:
        """Whether the next token may finish a several-token opening."""
        tail = self._tails[-1]
        return self._one_token is None and any(
            tail.endswith(self._opening[:size]) for size in range(1, len(self._opening))
        )

    def _wake(self) -> None:
        """The opening is written: the guide reads the text from it on, and masks the
        next token."""
        self._guide = self._start(self._tails[-1])
        self._guide_calls = 0
        if self._guide is None:  # the text after the opening does not fit: free again
            self.failed = True
            self._tails[-1] = self._tails[-1][len(self._opening) :]

    def rollback(self, tokens: int) -> None:
        """Take back the last `tokens` shown (drafted tokens a pass did not keep)."""
        if self._guide is not None:
            read = max(self._guide_calls - 1, 0)  # tokens the guide read after its start
            self._guide.rollback(min(tokens, read))
            self._guide_calls -= min(tokens, read)
            if tokens <= read:
                return
            tokens -= read
            self._guide = None  # free again; the opening, if kept, wakes it at the next call
        if tokens and self._pending is not None:
            self._pending = None
            tokens -= 1
        if tokens:
            del self._tails[-tokens:]

"""Stop strings matched on decoded text at any character boundary.

Why not mlx-lm's `TextStateMachine` (an Aho-Corasick trie over the same text): a client
needs to know which stop string ended the reply (Anthropic's `stop_sequence`), which its
transitions do not say, and the post-processor's markers and the stops share
`textscan`'s one notion of held-back text. It is faster (1.3 against 3.7 microseconds per
4-character chunk with four stop strings), a difference of microseconds per token where a
decode step takes milliseconds.
"""

from __future__ import annotations

from mlxserve.textscan import scan


class StopMatcher:
    """Feeds text through, holding back only what could still become a stop string.

    `feed` returns the text that is safe to emit and whether a stop string was found
    (`matched` then says which); the stop string itself and anything after it are never
    returned.
    """

    def __init__(self, stops: list[str]):
        self._stops = stops
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        ready, stop, self._pending = scan(self._pending + text, self._stops)
        if stop is not None:
            self._pending = ""
            self.matched = stop
        return ready, stop is not None

    def flush(self) -> str:
        """The held-back text, once generation ended without completing a stop string."""
        text, self._pending = self._pending, ""
        return text

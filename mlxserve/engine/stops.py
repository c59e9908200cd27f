"""Stop strings matched on decoded text at any character boundary."""

from __future__ import annotations


class StopMatcher:
    """Feeds text through, holding back only what could still become a stop string.

    `feed` returns the text that is safe to emit and whether a stop string was found;
    the stop string itself and anything after it are never returned.
    """

    def __init__(self, stops: list[str]):
        self._stops = stops
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        buffer = self._pending + text
        hits = [i for i in (buffer.find(stop) for stop in self._stops) if i >= 0]
        if hits:
            self._pending = ""
            return buffer[: min(hits)], True
        keep = self._partial_suffix(buffer)
        self._pending = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, once generation ended without completing a stop string."""
        text, self._pending = self._pending, ""
        return text

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest

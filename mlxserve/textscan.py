"""Scanning streamed text for markers that may arrive split across chunks."""

from __future__ import annotations


def partial_suffix(buffer: str, markers: list[str]) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of a marker:
    the text to hold back because the next chunk may complete it."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(buffer)), longest, -1):
            if buffer.endswith(marker[:size]):
                longest = size
                break
    return longest


def earliest(buffer: str, markers: list[str]) -> tuple[int, str] | None:
    """The first marker in `buffer` and where it starts (the longer one on a tie)."""
    hits = [(i, -len(m), m) for m in markers if m and (i := buffer.find(m)) >= 0]
    if not hits:
        return None
    index, _, marker = min(hits)
    return index, marker


def scan(buffer: str, markers: list[str]) -> tuple[str, str | None, str]:
    """Split `buffer` at its first marker: (text before it, the marker, the rest). With no
    marker in it: (the text that is safe to pass on, None, a possible partial marker)."""
    if found := earliest(buffer, markers):
        index, marker = found
        return buffer[:index], marker, buffer[index + len(marker) :]
    cut = len(buffer) - partial_suffix(buffer, markers)
    return buffer[:cut], None, buffer[cut:]

"""StopMatcher on its own: stop strings at any character boundary, split at any chunk."""

from __future__ import annotations

import pytest

from mlxserve.engine.generation.stops import StopMatcher

TEXT = "One, two, three, four, five."


def run(stops, pieces):
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


@pytest.mark.parametrize("stop", ["three", "e, f", ",", "five.", "One"])
def test_every_split_of_the_text(stop):
    expected = TEXT[: TEXT.find(stop)]
    for i in range(len(TEXT) + 1):
        for j in range(i, len(TEXT) + 1):
            assert run([stop], [TEXT[:i], TEXT[i:j], TEXT[j:]]) == (expected, True)


def test_partial_match_is_released_when_it_fails():
    matcher = StopMatcher(["threes"])
    assert matcher.feed("one three") == ("one ", False)
    assert matcher.feed(" four") == ("three four", False)


def test_unfinished_partial_match_is_flushed_at_the_end():
    assert run(["fives"], [TEXT]) == (TEXT, False)
    assert run(["five.!"], [TEXT]) == (TEXT, False)


def test_earliest_of_several_stops_wins():
    assert run(["four", "two"], [TEXT]) == ("One, ", True)


def test_no_stops_passes_everything():
    assert run([], ["a", "b"]) == ("ab", False)

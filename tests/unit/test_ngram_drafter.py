"""The prompt-lookup drafter: where drafts come from and how their length adapts."""

from __future__ import annotations

from mlxserve.engine.speculative import MAX_BACKOFF_STEPS, NgramDrafter


def test_the_draft_follows_the_latest_earlier_occurrence_of_the_longest_ngram():
    # (2, 3) occurred twice before; the later occurrence is followed by 9, 5
    assert NgramDrafter(8).propose([2, 3, 7, 2, 3, 9, 5, 2], 3, limit=2) == [9, 5]
    # (5, 2, 3) occurred once, earlier: the longer match wins
    assert NgramDrafter(8).propose([5, 2, 3, 7, 2, 3, 9, 5, 2], 3, limit=4) == [7, 2, 3, 9]


def test_no_draft_without_an_earlier_occurrence_and_none_past_the_limit():
    drafter = NgramDrafter(max_draft=8)
    assert drafter.propose([1, 2, 3, 4], 5, limit=8) == []
    assert drafter.propose(list(range(10)) * 2, 0, limit=2) == [1, 2]


def test_the_length_grows_while_drafts_are_accepted_and_shrinks_to_what_was():
    drafter = NgramDrafter(max_draft=6)
    assert drafter.length == 4
    drafter.record(drafted=4, accepted=4)
    assert drafter.length == 6  # doubled, up to the most allowed
    drafter.record(drafted=6, accepted=2)
    assert drafter.length == 3


def test_drafting_pauses_longer_after_each_outright_rejection():
    drafter = NgramDrafter(max_draft=8)
    repeating = [1, 2, 3] * 4
    pauses = []
    for _ in range(7):
        drafter.record(drafted=1, accepted=0)
        steps = 0
        while not drafter.propose(repeating, 1, limit=8):
            steps += 1
        pauses.append(steps)
    assert pauses == [2, 4, 8, 16, 32, MAX_BACKOFF_STEPS, MAX_BACKOFF_STEPS]
    drafter.record(drafted=1, accepted=1)  # an acceptance ends the backoff
    drafter.record(drafted=1, accepted=0)
    assert sum(1 for _ in range(2) if not drafter.propose(repeating, 1, limit=8)) == 2

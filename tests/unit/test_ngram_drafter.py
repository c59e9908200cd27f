"""The prompt-lookup drafter: where drafts come from and how their length adapts."""

from __future__ import annotations

from mlxserve.engine.speculation.prompt_lookup import MAX_BACKOFF_STEPS, NgramDrafter


def test_the_prediction_follows_the_latest_earlier_occurrence_of_the_longest_ngram():
    # (2, 3) occurred twice before the end; the later occurrence is followed by 9, 5, 2
    assert NgramDrafter(8).propose([2, 3, 7, 2, 3, 9, 5, 2, 3], limit=2) == [9, 5, 2]
    # (5, 2, 3) occurred once, earlier: the longer match wins
    context = [5, 2, 3, 7, 2, 3, 9, 5, 2, 3]
    assert NgramDrafter(8).propose(context, limit=4) == [7, 2, 3, 9, 5]


def test_a_record_copied_from_the_prompt_follows_the_prompts_same_item():
    """Each item of a record repeats its field names (k1..k4): their last occurrence is
    the item just copied, whose value (5) is wrong; the longer match, which names the
    item (B), finds the prompt's same item and its value (6)."""
    a, b, k = 100, 200, [11, 12, 13, 14]
    prompt = [0, a, *k, 5, b, *k, 6, 99]
    copied = [a, *k, 5, b, *k]
    assert NgramDrafter(8).propose([*prompt, *copied], limit=1) == [6, 99]


def test_a_recent_occurrence_runs_on_over_its_own_prediction():
    """A repeating stretch (a loop, a column of equal lines) is drafted at full length."""
    assert NgramDrafter(8).propose([1, 2, 3, 4, 4, 4, 4], limit=8) == [4] * 5
    assert NgramDrafter(8).propose([9, 1, 2, 1, 2, 1, 2], limit=8) == [1, 2, 1, 2, 1]


def test_no_prediction_without_an_earlier_occurrence_and_none_past_the_limit():
    assert NgramDrafter(8).propose([1, 2, 3, 4], limit=8) == []
    assert NgramDrafter(8).propose(list(range(10)) * 2, limit=2) == [0, 1, 2]


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
        while not drafter.propose(repeating, limit=8):
            steps += 1
        pauses.append(steps)
    assert pauses == [2, 4, 8, 16, 32, MAX_BACKOFF_STEPS, MAX_BACKOFF_STEPS]
    drafter.record(drafted=1, accepted=1)  # an acceptance ends the backoff
    drafter.record(drafted=1, accepted=0)
    assert sum(1 for _ in range(2) if not drafter.propose(repeating, limit=8)) == 2

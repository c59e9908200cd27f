"""The draft length a row's acceptance pays for at this device's measured costs
(`engine/speculation/draft_costs.py`), and the lengths that follow it."""

from __future__ import annotations

import pytest

from mlxserve.engine.speculation.draft_costs import LONGEST_REST, Acceptance, DraftCosts, PaidLength
from mlxserve.engine.speculation.draft_lengths import DraftLengths
from mlxserve.engine.speculation.prompt_lookup import NgramDrafter

FREE = DraftCosts((2, 9), (1.0, 1.0))  # memory-bound: a pass over 9 costs a step
SOME = DraftCosts((2, 9), (1.2, 2.6))  # a fifth of a step per token
DEAR = DraftCosts((2, 9), (1.8, 8.2))  # arithmetic-bound: nearly a step per token


def test_costs_between_and_past_the_widths_measured_are_linear():
    costs = DraftCosts((2, 5), (1.5, 3.0))
    assert [costs.of(w) for w in (1, 2, 3, 5, 7)] == [1.0, 1.5, 2.0, 3.0, 4.0]
    assert DraftCosts().of(9) == 1.0  # unmeasured: every width costs a step


@pytest.mark.parametrize(
    ("costs", "acceptance", "length"),
    [
        (FREE, 0.2, 8),  # free passes: the longest, whatever the acceptance
        (SOME, 0.95, 8),  # nearly every guess kept: the longest
        (SOME, 0.7, 3),  # 2.5 tokens for 1.6 steps
        (DEAR, 0.95, 1),  # a step per guess: one guess (1.95 tokens for 1.8 steps)
        (DEAR, 0.5, 0),  # 1.5 tokens for 1.8 steps: a plain step gains more
        (SOME, 0.1, 0),  # 1.1 tokens for 1.2 steps
        (FREE, 0.1, 8),  # free passes: a draft never costs
    ],
)
def test_the_best_length_gains_the_most_tokens_per_step(costs, acceptance, length):
    assert costs.best_length(acceptance, 8) == length


def test_acceptance_follows_the_recent_passes():
    acceptance = Acceptance()
    assert acceptance.rate == 0.5  # nothing seen: even odds
    for _ in range(10):
        acceptance.record(drafted=4, accepted=4)
    assert acceptance.rate > 0.9
    for _ in range(20):
        acceptance.record(drafted=4, accepted=0)
    assert acceptance.rate < 0.3


class Rows:
    """A batch as DraftLengths reads it: its rows' uids, room to draft and costs."""

    def __init__(self, uids: list[int], costs: DraftCosts):
        self.uids, self.costs = uids, costs

    def room(self, row: int) -> int:
        return 99


def test_rows_that_miss_draft_short_where_passes_cost():
    for costs, after in ((FREE, 2), (SOME, 1)):
        lengths = DraftLengths()
        batch = Rows([1, 2], costs)
        lengths.of(batch, 8)
        for _ in range(6):  # row 2 keeps one guess of each two: half its guesses
            lengths.record(1, drafted=8, accepted=8)
            lengths.record(2, drafted=2, accepted=1)
        assert lengths.of(batch, 8) == [8, after]


def test_a_lookup_drafts_no_longer_than_its_acceptance_pays_for():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3
    free, some = NgramDrafter(8, FREE), NgramDrafter(8, SOME)
    for drafter in (free, some):
        for _ in range(4):
            drafter.record(drafted=4, accepted=1)
        drafter.length = 8  # what its acceptance rule allows
    assert len(free.propose(context, 99)) == 1 + 8
    assert len(some.propose(context, 99)) == 1 + 1


def test_a_row_no_draft_pays_for_tries_one_token_after_ever_longer_rests():
    paid = PaidLength(DEAR)
    for _ in range(3):
        paid.record(drafted=1, accepted=0)
    steps = [paid.length(8) for _ in range(2 + 1 + 4 + 1 + 8 + 1 + 16 + 1 + 32 + 1 + 32 + 1)]
    tries = [i for i, n in enumerate(steps) if n]
    assert tries == [0, 3, 8, 17, 34, 67]  # rests of 2, 4, 8, 16, 32 and no longer
    assert set(steps) == {0, 1} and LONGEST_REST == 32


def test_a_row_whose_tries_are_accepted_drafts_again():
    paid = PaidLength(SOME)
    for _ in range(6):
        paid.record(drafted=1, accepted=0)
    assert paid.length(8) == 1  # a try
    assert paid.length(8) == 0
    for _ in range(4):  # its guesses hit now
        paid.record(drafted=1, accepted=1)
    assert paid.length(8) > 1
    assert paid.length(8) > 1  # no rest left over


def test_rows_that_always_miss_draft_only_their_tries_where_passes_cost():
    """Passes cost nearly a step per token: one guess pays where nearly all are kept.
    Both rows start with even odds (no draft pays) and try; row 1's tries are kept, so
    it tries again at once and soon pays; row 2's never are."""
    lengths = DraftLengths()
    batch = Rows([1, 2], DEAR)
    drafted: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(100):
        for uid, n in zip(batch.uids, lengths.of(batch, 8), strict=True):
            drafted[uid].append(n)
            if n:
                lengths.record(uid, drafted=n, accepted=n if uid == 1 else 0)
    assert drafted[1] == [1] * 100  # each try kept: tried again at once, until one pays
    assert sum(drafted[2]) == 6  # its tries: after rests of 2, 4, 8, 16 and 32 steps


def test_kept_tries_rest_still_where_no_acceptance_could_pay():
    """A pass over two tokens costs 1.9 steps: even a guess always kept (a rate of at most
    Acceptance.HIGHEST) gains less, so kept tries do not end a rest."""
    paid = PaidLength(DraftCosts((2, 9), (1.9, 8.5)))
    steps = []
    for _ in range(40):
        steps.append(paid.length(8))
        if steps[-1]:
            paid.record(drafted=1, accepted=1)
    assert [i for i, n in enumerate(steps) if n] == [0, 3, 8, 17, 34]


def test_a_new_row_starts_from_the_acceptance_of_the_rows_before_it():
    """Where passes cost a fifth of a step a token, a row at even odds drafts; after rows
    whose guesses all missed, a new row only tries, then rests."""
    lengths = DraftLengths()
    batch = Rows([1], SOME)
    assert all(lengths.of(batch, 8)[0] > 0 for _ in range(3))
    for _ in range(6):
        lengths.record(1, drafted=1, accepted=0)
    batch.uids = [2]
    assert [lengths.of(batch, 8)[0] for _ in range(3)] == [1, 0, 0]

"""The draft length a row's acceptance pays for at this device's measured costs
(`engine/draft_costs.py`), and the lengths that follow it."""

from __future__ import annotations

import pytest

from mlxserve.engine.draft_costs import Acceptance, DraftCosts
from mlxserve.engine.speculative import DraftLengths, NgramDrafter

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

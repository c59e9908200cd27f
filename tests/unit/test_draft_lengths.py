"""The draft length of drafters that guess for every row (a draft model, a head, a DFlash
block): it follows each row's acceptance, within the row's token limit."""

from __future__ import annotations

from mlxserve.engine.speculation.draft_costs import DraftCosts
from mlxserve.engine.speculation.draft_lengths import DraftLength, DraftLengths


def test_the_length_shrinks_to_what_was_kept_and_grows_back_while_drafts_are_kept_whole():
    length = DraftLength(longest=6)
    assert length.length == 6
    length.record(drafted=6, accepted=2)
    assert length.length == 3  # what was kept, and one more
    length.record(drafted=3, accepted=0)
    assert length.length == 1
    for expected in (2, 4, 6, 6):
        length.record(drafted=length.length, accepted=length.length)
        assert length.length == expected


class Rows:
    """A batch as DraftLengths reads it: its rows' uids and room to draft (its passes
    unmeasured: every width costs a step)."""

    costs = DraftCosts()

    def __init__(self, uids: list[int], rooms: list[int]):
        self.uids, self.rooms = uids, rooms

    def room(self, row: int) -> int:
        return self.rooms[row]


def test_each_row_has_its_own_length_within_its_token_limit():
    lengths = DraftLengths()
    batch = Rows([7, 8, 9], [99, 99, 1])
    assert lengths.of(batch, 3) == [3, 3, 1]  # row 9 has room for one token after the next
    lengths.record(8, drafted=3, accepted=0)
    assert lengths.of(batch, 3) == [3, 1, 1]
    batch.rooms[2] = 0
    assert lengths.of(batch, 3) == [3, 1, 0]  # at its limit: no draft
    # rows that left are forgotten; a new row starts at the longest
    assert lengths.of(Rows([8, 10], [99, 99]), 3) == [1, 3]

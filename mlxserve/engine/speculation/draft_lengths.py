"""Each row's draft length for a drafter that guesses for every row (a draft model, a
head, a DFlash block), following how much of its drafts was accepted (`DraftLength`), and
a batch's rows' lengths by uid (`DraftLengths`)."""

from __future__ import annotations

from typing import Any

from mlxserve.engine.speculation.draft_costs import Acceptance, DraftCosts, PaidLength


class DraftLength:
    """One row's draft length for a drafter that guesses for every row (a draft model, a
    head, a DFlash block): doubled (up to `longest`) while its drafts are accepted whole,
    cut to what was accepted and one more otherwise. A verify pass costs more the wider
    its widest row, and a chained drafter a step per guess: rows whose guesses miss stop
    paying for the guesses they would not keep. Its acceptance is kept too, for the
    length the device's costs pay for (`draft_costs`)."""

    def __init__(
        self, longest: int, costs: DraftCosts | None = None, prior: Acceptance | None = None
    ):
        self.longest = longest
        self.length = longest
        self.paid = PaidLength(costs or DraftCosts(), prior)

    def record(self, drafted: int, accepted: int) -> None:
        self.paid.record(drafted, accepted)
        if accepted == drafted:
            self.length = min(2 * self.length, self.longest)
        else:
            self.length = accepted + 1


class DraftLengths:
    """The draft lengths of a batch's rows, by uid: each starts at the longest, its
    acceptance at that of the passes before it, every row's (a drafter whose guesses
    miss for one reply mostly misses for the next: a new row does not start by paying
    for guesses at even odds)."""

    def __init__(self) -> None:
        self._rows: dict[int, DraftLength] = {}
        self._pooled = Acceptance()

    def of(self, batch: Any, longest: int) -> list[int]:
        """Each row's draft length this step (at most `longest`, and what the batch's
        costs pay for at its acceptance: none where nothing pays), within its token limit
        (0 at the limit); the rows that left the batch are forgotten."""
        rows, lengths = {}, []
        for i, uid in enumerate(batch.uids):
            row = self._rows.get(uid) or DraftLength(longest, batch.costs, self._pooled)
            rows[uid] = row
            room = batch.room(i)
            paid = row.paid.length(longest) if room > 0 else 0
            lengths.append(max(0, min(row.length, paid, room)))
        self._rows = rows
        return lengths

    def record(self, uid: int, drafted: int, accepted: int) -> None:
        self._rows[uid].record(drafted, accepted)
        self._pooled.record(drafted, accepted)

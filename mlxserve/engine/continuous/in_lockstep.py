"""Rows that ranks run in lockstep (mlxserve.distributed; the loop's side:
`loop/loop_step.py`): every rank generates the same tokens, which each keeps a hash of,
rank 0's checked against the others' every step. Beside it, lockstep rules other features
out (adapters, a hidden-state drafter: `features.py`, `speculation_plan.py`) and makes
every measured decision the worst rank's (`worst`)."""

from __future__ import annotations

from typing import Any

from mlxserve.engine.continuous.row_feature import RowFeature


class LockstepFeature(RowFeature):
    def __init__(self) -> None:
        self.trace = 0  # a hash of every (row, token) generated, in order

    def stepped(self, responses: list[Any]) -> None:
        for r in responses:
            self.trace = hash((self.trace, r.uid, r.token))

"""A value per batch row that travels as one more cache entry: mlx-lm's batch merges,
filters, extends and extracts it with the row's attention caches, and the prompt cache
and disk tier keep it with them. It holds no positions, so trimming changes nothing.
Subclasses say what the value is (vision_model.RopeDeltas, adapter_rows.AdapterRows)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


class RowEntry:
    """mlx-lm's cache protocol for a value that holds no positions."""

    @property
    def state(self) -> list[mx.array]:
        raise NotImplementedError

    @state.setter
    def state(self, value: list[mx.array]) -> None:
        raise NotImplementedError

    @property
    def meta_state(self) -> str:
        return ""

    @meta_state.setter
    def meta_state(self, value: str) -> None:
        pass

    def prepare(self, **kwargs: Any) -> None:
        pass

    def finalize(self) -> None:
        pass

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        return n

    def size(self) -> int:
        return 0

    def empty(self) -> bool:
        return False

"""Rows of one batch under different adapters (adapters/layers.py): each row's adapter
slot travels with its caches as one more entry (`AdapterRows`), so however mlx-lm's batch
merges, filters and extends rows, the model called over them (`AdapterRowsModel`) knows
which adapter each row of the pass uses and routes the adapted layers accordingly.

A row's entry in the prompt cache holds the slot it had; a row taken from the cache
gets its job's slot again (`with_slot`), since entries are keyed by adapter anyway and
slots are only this process's numbering.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.adapters.layers import BASE, ModelAdapters
from mlxserve.compat import register_cache_class
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.values import ints

# Added to a model's prompt-cache key where its rows carry an AdapterRows entry: entries
# laid out without one never meet them (the disk tier outlives a version).
ADAPTER_ROWS_KEY = "|adapter-rows"


class AdapterRows(RowEntry):
    """Each row's adapter slot (`layers.BASE`: none)."""

    def __init__(self, slots: list[int] | None = None):
        self.slots = slots if slots is not None else [BASE]

    @property
    def state(self) -> list[mx.array]:
        return [mx.array(self.slots, dtype=mx.int32)]

    @state.setter
    def state(self, value: list[mx.array]) -> None:
        self.slots = ints(value[0])

    @classmethod
    def from_state(cls, state: list[mx.array], meta_state: Any = None) -> AdapterRows:
        rows = cls()
        rows.state = state
        return rows

    @classmethod
    def merge(cls, caches: list[AdapterRows]) -> AdapterRows:
        return cls([s for c in caches for s in c.slots])

    def extend(self, other: AdapterRows) -> None:
        self.slots = self.slots + other.slots

    def filter(self, batch_indices: Any) -> None:
        indices = ints(batch_indices) if isinstance(batch_indices, mx.array) else batch_indices
        self.slots = [self.slots[int(i)] for i in indices]

    def extract(self, idx: int) -> AdapterRows:
        return AdapterRows([self.slots[idx]])

    @property
    def nbytes(self) -> int:
        return 0  # a Python list: no MLX memory (its array exists only to be saved)


register_cache_class(AdapterRows)  # the disk tier reads rows back by class name


class AdapterRowsModel:
    """`inner` (what the batch calls: a model, or one wrapped to keep its hidden states)
    with each pass routed by its rows' `AdapterRows`, the entry after the inner model's
    own caches in every row's list."""

    def __init__(self, inner: Any, adapters: ModelAdapters):
        self.inner = inner
        self.adapters = adapters
        self.index = len(make_prompt_cache(inner))  # where a row's entry sits

    def make_cache(self) -> list[Any]:
        return [*make_prompt_cache(self.inner), AdapterRows()]

    @property
    def layers(self) -> Any:
        return self.inner.layers

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **kwargs: Any) -> Any:
        if cache is None:
            return self.inner(inputs, **kwargs)
        rows = cache[self.index]
        with self.adapters.routing.rows(rows.slots):
            return self.inner(inputs, cache=cache[: self.index], **kwargs)

    def __getattr__(self, name: str) -> Any:
        """What else the batch reads of the model (a hidden-state capture's `hidden`)."""
        return getattr(self.inner, name)


def with_slot(caches: list[Any], index: int, slot: int) -> list[Any]:
    """A row's caches with its adapter entry (at `index`) set to `slot`."""
    return [*caches[:index], AdapterRows([slot]), *caches[index + 1 :]]

"""Rows of one batch under different adapters (adapters/layers.py): each row's adapter
slot travels with its caches as one more entry (`AdapterRows`), so however mlx-lm's batch
merges, filters and extends rows, the model called over them (`AdapterRowsModel`) knows
which adapter each row of the pass uses and routes the adapted layers accordingly.

A row's entry in the prompt cache holds the slot it had; a row taken from the cache
gets its job's slot again (`with_slot`), since entries are keyed by adapter anyway and
slots are only this process's numbering. `AdapterFeature` is what the batch asks of them
(a `row_feature.RowFeature`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.adapters.layers import BASE, ModelAdapters, Resident
from mlxserve.compat import register_cache_class
from mlxserve.engine.caches.prompt_cache import CacheHit
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.engine.continuous.row_feature import RowFeature
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.protocol.errors import bad_request
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


class AdapterFeature(RowFeature):
    """The batch's rows of a text model that takes adapters, each under its own (or none):
    the batch calls `model`, and a row's prompt-cache entries are its adapter's. Where
    rows take none (`adapters` None: ranks in lockstep), a job naming one is refused."""

    def __init__(self, model: Any, adapters: ModelAdapters | None, name: str):
        """`model`: what the batch would call without adapters; `name`: the model's, for
        errors."""
        self.model: Any = AdapterRowsModel(model, adapters) if adapters is not None else model
        self.key = ADAPTER_ROWS_KEY if adapters is not None else ""
        self._adapters = adapters
        self._name = name

    def prompt_key(self, job: GenerationJob) -> str:
        return "" if job.adapter is None else self._resident(job).cache_key

    def fetched(self, job: GenerationJob, hit: CacheHit) -> None:
        """The entry's slot may be another run's: the job's own."""
        if self._adapters is not None:
            slot = BASE if job.adapter is None else self._resident(job).slot
            hit.cache = with_slot(hit.cache, self.model.index, slot)

    def _resident(self, job: GenerationJob) -> Resident:
        """The adapter a job's rows use (residency.py made it resident before the job was
        admitted)."""
        assert job.adapter is not None
        resident = self._adapters.get(job.adapter) if self._adapters is not None else None
        if resident is None:
            raise bad_request(
                f"The adapter '{job.adapter}' is not loaded on {self._name}.",
                param="model",
                code="adapter_not_loaded",
            )
        return resident

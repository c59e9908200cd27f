"""Idle-priority rows (Batch API lines) out of the continuous batch while interactive work
runs, and back where they stopped once it is over; rows joining them a part of the join
a loop iteration (`idle_joins.JoinsApart`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mlx_lm.generate import BatchGenerator, GenerationBatch

from mlxserve.compat import generation_batch, install_generation_batch
from mlxserve.engine.caches.prompt_cache import PromptCache, cache_bytes
from mlxserve.engine.continuous.idle_joins import JoinsApart
from mlxserve.engine.continuous.rows import Row
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.engine.speculation.verify import empty_sibling

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Parked:
    """Idle-priority rows out of the batch while interactive work runs: mlx-lm's batch that
    held them, set aside whole. It keeps everything each row needs to go on exactly as if
    it had never stopped (caches, the token it sampled last, sampler, processors, drafting
    state), and coming back costs nothing: no row's caches are taken out or merged again
    (row by row, that cost 32 rows 0.3 s on a CPU, an interactive request's wait)."""

    batch: GenerationBatch
    rows: dict[int, Row]  # by uid, as the batch holds them


class IdleParking:
    def __init__(
        self,
        generator: BatchGenerator,
        rows: dict[int, Row],
        cache: PromptCache,
        remove: Callable[[list[int], bool], None],
        whole: bool,
    ):
        """`rows`: the batch's running rows, by uid (rows parked leave it, and come back);
        `remove`: takes rows out of the batch (their caches kept in the prompt cache if
        asked); `whole`: whether rows can leave whole and come back exactly where they
        stopped, every row's state in its caches (no drafter's or vision encoder's beside
        them: `RowFeature.parks`); rows joining them, likewise, are taken through their
        prompt apart."""
        self._generator = generator
        self._rows = rows
        self._cache = cache
        self._remove = remove
        self._whole = whole
        self._parked: _Parked | None = None
        self.joins = JoinsApart(generator)

    def __len__(self) -> int:
        return len(self._parked.rows) if self._parked is not None else 0

    def jobs(self) -> list[GenerationJob]:
        return [row.job for row in self._parked.rows.values()] if self._parked is not None else []

    def live_bytes(self) -> int:
        """The parked rows' and the joining rows' KV bytes."""
        parked = cache_bytes(self._parked.batch.prompt_cache) if self._parked is not None else 0
        return parked + self.joins.nbytes()

    def arrange(self, interactive: bool) -> bool:
        """Before a step: parked rows whose job is over end; idle-priority rows leave while
        `interactive` work runs, else come back. True where rows join apart this step
        (only idle-priority rows run, and could be parked whole); elsewhere rows through
        their first pass join the running batch now."""
        self.end()
        if interactive:
            self._park()
        else:
            self._resume()
        apart = not interactive and self._whole and bool(generation_batch(self._generator))
        if not apart:
            self.joins.merge()
        return apart

    def _park(self) -> None:
        """Interactive work runs alone: idle-priority rows leave the batch, keeping their
        state, until it is over. Where the batch holds only such rows and their state is
        all in it, the whole batch is set aside (`_Parked`); otherwise (a row in mlx-lm's
        prompt stage, a drafter's or vision encoder's state beside the caches) a row ends
        with `preempted` and runs again from the prompt cache."""
        self.joins.merge()
        idle = [uid for uid, row in self._rows.items() if row.job.idle_priority]
        if not idle:
            return
        log.info("%d batch rows pause while interactive work runs", len(idle))
        batch = generation_batch(self._generator)
        whole = self._whole and self._parked is None and set(batch.uids) <= set(idle)
        parks = list(batch.uids) if whole else []
        others = [uid for uid in idle if uid not in parks]
        for uid in others:
            self._rows[uid].job.preempt()
        self._remove(others, True)
        if parks:
            install_generation_batch(self._generator, empty_sibling(batch))
            self._parked = _Parked(batch, {uid: self._rows.pop(uid) for uid in parks})

    def _resume(self) -> None:
        """Parked rows go on where they stopped: their batch back in place, or joined to
        the rows still in the batch then (say, a dropped row not yet removed)."""
        if self._parked is None:
            return
        parked, self._parked = self._parked, None
        batch = generation_batch(self._generator)
        if batch.uids:
            batch.extend(parked.batch)
        else:
            install_generation_batch(self._generator, parked.batch)
        self._rows.update(parked.rows)

    def end(self) -> None:
        """Parked rows whose client left are dropped; those whose client has what it
        wants end as stopped (their last sampled token not output), caches kept."""
        if self._parked is None:
            return
        batch, rows = self._parked.batch, self._parked.rows
        keep = []
        for i, uid in enumerate(batch.uids):
            row = rows[uid]
            job = row.job
            if not job.cancelled.is_set() and not job.finish_requested.is_set():
                keep.append(i)
                continue
            if not job.cancelled.is_set():  # its client has what it wants
                key = row.key_tokens(batch.tokens[i])
                self._cache.store(row.key, key, batch.extract_cache(i))
                row.output.finish("stop")
            del rows[uid]
        if len(keep) < len(batch.uids):
            batch.filter(keep)
        if not rows:
            self._parked = None

    def preempt(self, waiting: list[GenerationJob]) -> None:
        """End every idle-priority job, running (its caches kept in the prompt cache),
        parked or `waiting` to join (interactive work wants their memory)."""
        self.joins.merge()
        idle = [uid for uid, row in self._rows.items() if row.job.idle_priority]
        for uid in idle:
            self._rows[uid].job.preempt()
        self._remove(idle, True)
        for job in [*waiting, *self.jobs()]:
            if job.idle_priority and not job.cancelled.is_set():
                job.preempt()

    @property
    def parked(self) -> bool:
        return self._parked is not None

    def close(self) -> None:
        self._parked = None
        self.joins.clear()

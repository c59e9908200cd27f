"""Rows joining a batch of idle-priority rows, each part of the join a loop iteration of its
own.

mlx-lm's BatchGenerator does in one call a decode step of the running rows, a prompt pass
of rows joining, their first pass, and the copy of their caches into the running batch's.
An interactive request that comes meanwhile waits for all of it: on a CPU, with 32 rows of
a 50M model, 0.2 to 0.45 s where a decode step alone takes 0.08 s, so Batch API lines
joining every other step nearly doubled the wait of an editor's completion beside a batch.
Apart, the request waits for the one part running when it comes (a decode step, or a
prompt pass, a first pass or a merge of the joining rows): the running batch is set aside
while the generator takes the joining rows through their prompt and first pass alone,
then their caches are merged in and computed.
The work is the same; only the loop looks for interactive work between its parts.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from mlxserve.compat import generation_batch, install_generation_batch, prompt_stage
from mlxserve.engine.caches.prompt_cache import cache_bytes
from mlxserve.engine.speculation.verify import empty_sibling


class JoinsApart:
    """The joining rows of one ContinuousBatch's generator: `step` takes them one part
    further; rows through their first pass wait beside the running batch until the next
    step merges them. Anything that reads or removes rows in the generator calls `merge`
    first."""

    def __init__(self, generator: Any):
        self._generator = generator
        self._joining: GenerationBatch | None = None

    def step(self) -> bool:
        """One part of the join, if rows are joining (False: none are): the merge of rows
        through their first pass, else the generator's prompt work for the rest alone."""
        if self._joining is not None:
            self.merge(compute=True)
            return True
        if not prompt_stage(self._generator):
            return False
        running = generation_batch(self._generator)
        install_generation_batch(self._generator, empty_sibling(running))
        try:
            self._generator.next()  # nothing decodes: the joining rows' prompts only
            arrived = generation_batch(self._generator)
        finally:
            install_generation_batch(self._generator, running)
        if arrived.uids:  # through their first pass: their first tokens come from the batch
            mx.eval(arrived._next_tokens, arrived._next_logprobs)
            self._joining = arrived
        return True

    def merge(self, compute: bool = False) -> None:
        """Rows through their first pass join the running batch: `compute`, their caches
        copied in now; else when the batch next runs (the merge is lazy)."""
        joining, self._joining = self._joining, None
        if joining is None:
            return
        running = generation_batch(self._generator)
        if not running.uids:
            install_generation_batch(self._generator, joining)
            return
        running.extend(joining)
        if compute:
            mx.eval([c.state for c in running.prompt_cache], running._next_tokens)

    def nbytes(self) -> int:
        """The joining rows' KV bytes, held outside the generator."""
        return cache_bytes(self._joining.prompt_cache) if self._joining is not None else 0

    def clear(self) -> None:
        self._joining = None

"""One request at a time, a token per step, for a model whose caches do not batch (Llama
4's chunked attention, a vision model's caches of that kind): the same session interface
as `continuous.continuous_batch.ContinuousBatch`, so the generation thread steps it beside other models'
batches."""

from __future__ import annotations

import logging
from collections import deque

from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.generation.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.generation.sampling import reseed_random
from mlxserve.engine.memory.footprint import KVFootprint
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.single.text_run import SingleRun, generate_single
from mlxserve.engine.speculation.verify import SpeculationCounts
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import bad_request, internal_error

log = logging.getLogger(__name__)


class StreamSession:
    """A `session.Session`."""

    speculation: SpeculationCounts | None = None  # it does not speculate
    footprint: KVFootprint | None = None  # not measured: one sequence at a time
    checkpoints = False  # its runs leave no checkpoints (see ContinuousBatch)
    trace = 0  # never in lockstep

    def __init__(self, loaded: LoadedModel, cache: PromptCache, prefill_chunk: int):
        self._loaded = loaded
        self._cache = cache
        self._prefill_chunk = prefill_chunk
        self._queue: deque[GenerationJob] = deque()
        self._run: SingleRun | None = None

    @property
    def spec(self) -> ModelSpec:
        return self._loaded.spec

    @property
    def weight_bytes(self) -> int:
        return self._loaded.nbytes

    def __len__(self) -> int:
        return len(self._queue) + (self._run is not None)

    @property
    def decoding(self) -> int:
        return int(self._run is not None)

    def ready(self) -> bool:
        """Whether a step would do anything now."""
        return len(self) > 0

    @property
    def idle_slots(self) -> int:
        return 1 - len(self)

    def preempt_idle(self) -> None:
        """End the running job and the waiting ones that have idle priority."""
        for job in [job for job in self._queue if job.idle_priority]:
            job.preempt()
            self._queue.remove(job)
        self._yield_to_interactive()

    def _yield_to_interactive(self) -> None:
        """End the running job if it has idle priority (it runs again later)."""
        if self._run is not None and self._run.job.idle_priority:
            self._run.job.preempt()
            self._run = None

    def jobs(self) -> list[GenerationJob]:
        return ([self._run.job] if self._run is not None else []) + list(self._queue)

    def fits(self, jobs: list[GenerationJob], room: int | None) -> bool:
        return True  # they wait in line here

    def reserved_bytes(self) -> int:
        return 0  # not measured: one sequence at a time

    def live_bytes(self) -> int:
        return 0  # not measured: one sequence at a time

    def admit(self, job: GenerationJob) -> None:
        if job.adapter is not None:
            raise bad_request(
                f"{self.spec.path.name} runs one request at a time (its caches do not "
                "batch); adapters are served in the continuous batch only.",
                param="model",
                code="adapter_invalid",
            )
        self._queue.append(job)

    def step(self) -> None:
        """Start the next job if none runs (an interactive one before idle-priority ones,
        whose running one gives way to it), then generate one token of the running one."""
        if any(not job.idle_priority for job in self._queue):
            self._yield_to_interactive()
        if self._run is None and not self._start():
            return
        run = self._run
        if run is None:  # `_start` found a job when it returned True
            return
        try:
            if not run.advance():
                self._run = None
        except Exception as e:
            self._run = None
            log.exception("generation failed")
            reseed_random()
            run.job.emit(ErrorEvent(internal_error(f"Generation failed: {e}")))

    def close(self) -> None:
        self._queue.clear()
        self._run = None

    def _start(self) -> bool:
        while self._queue:
            job = next((j for j in self._queue if not j.idle_priority), self._queue[0])
            self._queue.remove(job)
            if job.cancelled.is_set():
                continue
            try:
                if self.spec.vision:  # mlx-vlm's generate, imported for a vision model only
                    from mlxserve.engine.single.vision_run import generate_vision

                    self._run = generate_vision(self._loaded, self._cache, job, self._prefill_chunk)
                else:
                    self._run = generate_single(self._loaded, self._cache, job, self._prefill_chunk)
                return True
            except Exception as e:
                log.exception("generation failed")
                reseed_random()
                job.emit(ErrorEvent(internal_error(f"Generation failed: {e}")))
        return False

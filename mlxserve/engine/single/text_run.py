"""Single-stream generation (mlx-lm's stream_generate), for text models whose caches do
not batch; vision models' is in `vision_run`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.engine.caches.prompt_cache import CacheHit, PromptCache
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.engine.generation.sampling import build_logits_processors, build_sampler
from mlxserve.engine.generation.sequence import SequenceOutput
from mlxserve.engine.memory.loader import LoadedModel

log = logging.getLogger(__name__)

# (token, its logprobs, finish reason or None) for each generated token
Step = tuple[int, mx.array, str | None]


class Cancelled(Exception):
    """Raised from a prefill progress callback to abandon a cancelled job."""


def generate_single(
    loaded: LoadedModel,
    cache: PromptCache,
    job: GenerationJob,
    prefill_chunk: int,
) -> SingleRun:
    hit = cache.fetch(job.spec.key, lambda: make_prompt_cache(loaded.model), job.prompt)
    tokenizer = loaded.tokenizer
    params = job.params
    generation = stream_generate(
        loaded.model,
        tokenizer,
        hit.rest,
        max_tokens=params.max_tokens,
        sampler=build_sampler(params, tokenizer.all_special_ids, len(tokenizer)),
        logits_processors=build_logits_processors(params),
        prompt_cache=hit.cache,
        prefill_step_size=prefill_chunk,
        prompt_progress_callback=_progress(job, len(hit.rest)),
    )
    steps = ((gen.token, gen.logprobs, gen.finish_reason) for gen in generation)
    return SingleRun(loaded, cache, job, hit, job.prompt, steps)


class SingleRun:
    """One job generated a token at a time, so that other models' batches step between
    its tokens; what its cache holds at the end is kept under `cache_tokens` + the
    output."""

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PromptCache,
        job: GenerationJob,
        hit: CacheHit,
        cache_tokens: list[int],
        steps: Iterator[Step],
    ):
        self.job = job
        self._cache = cache
        self._hit = hit
        self._steps = steps
        self._output = SequenceOutput(job, loaded.tokenizer, hit)
        self._fed = list(cache_tokens)

    def advance(self) -> bool:
        """Generate the next token and send its events; False once the job is over (a
        finish, a stop string, a finish the client asked for, or a cancellation)."""
        if self.job.cancelled.is_set():
            return False
        try:
            token, logprobs, finish_reason = next(self._steps)
        except StopIteration:
            self._finish(None)
            return False
        except Cancelled:
            return False
        self._fed.append(token)
        if self._output.add(token, logprobs, finish_reason) or finish_reason:
            self._finish(finish_reason)
            return False
        if self.job.finish_requested.is_set():  # the client has what it wants
            self._finish("stop")
            return False
        return True

    def _finish(self, finish_reason: str | None) -> None:
        self._cache.store(self.job.spec.key, self._fed, self._hit.cache)
        self._output.finish(finish_reason or "stop")


def _progress(job: GenerationJob, total: int) -> Callable[[int, int], None]:
    """Logs long prefills and abandons them as soon as the client has gone."""
    start = time.perf_counter()

    def report(processed: int, _total: int) -> None:
        if job.cancelled.is_set():
            raise Cancelled
        if total > 1024 and 0 < processed < total:
            log.info(
                "prompt processing %d/%d tokens (%.1fs)",
                processed,
                total,
                time.perf_counter() - start,
            )

    return report

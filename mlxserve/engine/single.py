"""Single-stream generation with mlx-lm's stream_generate, for what batching cannot run:
speculative decoding with a draft model."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mlx_lm import stream_generate

from mlxserve.engine.jobs import GenerationJob
from mlxserve.engine.prompt_cache import PromptCache
from mlxserve.engine.sampling import build_logits_processors, build_sampler
from mlxserve.engine.sequence import SequenceOutput
from mlxserve.models.provider import LoadedModel

log = logging.getLogger(__name__)


class _Cancelled(Exception):
    """Raised from the prefill progress callback to abandon a cancelled job."""


def generate_single(
    loaded: LoadedModel, cache: PromptCache, job: GenerationJob, prefill_chunk: int
) -> None:
    models = [loaded.model, loaded.draft_model]
    hit = cache.fetch(job.spec.key, models, job.prompt)
    tokenizer = loaded.tokenizer
    output = SequenceOutput(job, tokenizer, hit.cached_tokens)
    fed = list(job.prompt)
    params = job.params
    try:
        for gen in stream_generate(
            loaded.model,
            tokenizer,
            hit.rest,
            max_tokens=params.max_tokens,
            sampler=build_sampler(params, tokenizer.all_special_ids, len(tokenizer)),
            logits_processors=build_logits_processors(params),
            prompt_cache=hit.cache,
            draft_model=loaded.draft_model,
            num_draft_tokens=job.num_draft_tokens,
            prefill_step_size=prefill_chunk,
            prompt_progress_callback=_progress(job, len(hit.rest)),
        ):
            fed.append(gen.token)
            stopped = output.add(gen.token, gen.logprobs, gen.finish_reason)
            if stopped or gen.finish_reason:
                break
            if job.cancelled.is_set():
                return
    except _Cancelled:
        return
    cache.store(job.spec.key, fed, hit.cache)
    output.finish(gen.finish_reason or "stop")


def _progress(job: GenerationJob, total: int) -> Callable[[int, int], None]:
    """Logs long prefills and abandons them as soon as the client has gone."""
    start = time.perf_counter()

    def report(processed: int, _total: int) -> None:
        if job.cancelled.is_set():
            raise _Cancelled
        if total > 1024 and 0 < processed < total:
            log.info(
                "prompt processing %d/%d tokens (%.1fs)",
                processed,
                total,
                time.perf_counter() - start,
            )

    return report

"""Continuous batching for one loaded model, on mlx-lm's BatchGenerator.

New sequences join the running batch at the next step; each keeps its own sampler,
logits processors, stop strings, logprobs and token limit. A sequence that finishes, hits
a stop string or is cancelled leaves the batch at once and its KV cache goes to the
prompt cache.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache

from mlxserve.engine.jobs import GenerationJob
from mlxserve.engine.prompt_cache import CacheHit, PromptCache
from mlxserve.engine.sampling import build_logits_processors, build_sampler
from mlxserve.engine.sequence import SequenceOutput
from mlxserve.models.provider import LoadedModel

log = logging.getLogger(__name__)

LONG_PROMPT = 1024  # prompts longer than this log their progress


def can_batch(loaded: LoadedModel) -> bool:
    """Batching needs caches that merge into batch caches, and no draft model."""
    if loaded.draft_model is not None:
        return False
    return all(hasattr(c, "merge") for c in make_prompt_cache(loaded.model))


@dataclass
class BatchLimits:
    decode: int = 32  # sequences decoding together
    prefill: int = 8  # prompts processed together
    prefill_chunk: int = 2048  # prompt tokens per model call


@dataclass
class _Sequence:
    job: GenerationJob
    output: SequenceOutput
    prompt_tokens: int
    started: float


class BatchSession:
    def __init__(self, loaded: LoadedModel, cache: PromptCache, limits: BatchLimits):
        self._loaded = loaded
        self._cache = cache
        self._limits = limits
        tokenizer = loaded.tokenizer
        self._generator = BatchGenerator(
            loaded.model,
            stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
            completion_batch_size=limits.decode,
            prefill_batch_size=limits.prefill,
            prefill_step_size=limits.prefill_chunk,
        )
        self._sequences: dict[int, _Sequence] = {}

    @property
    def spec(self):
        return self._loaded.spec

    def __len__(self) -> int:
        return len(self._sequences)

    def jobs(self) -> list[GenerationJob]:
        return [s.job for s in self._sequences.values()]

    def admit(self, jobs: list[GenerationJob]) -> None:
        """Add jobs with the same prompt (a request's `n` choices): the prompt is
        processed once and each job continues from a copy of its cache."""
        prompt = jobs[0].prompt
        hit = self._cache.fetch(self.spec.key, [self._loaded.model], prompt)
        if len(jobs) > 1 and len(hit.rest) > 1:
            hit = self._prefill_shared(jobs, hit)
            if hit is None:
                return
        for i, job in enumerate(jobs):
            cache = hit.cache if i == len(jobs) - 1 else copy.deepcopy(hit.cache)
            self._insert(job, cache, hit)
        self._trim_prompt_cache()

    def step(self) -> None:
        """One decode step for every running sequence (plus a chunk of any new prompts)."""
        prompt_responses, responses = self._generator.next()
        for r in prompt_responses:
            self._log_progress(r)
        finished: list[int] = []
        stopped: list[int] = []
        for r in responses:
            sequence = self._sequences[r.uid]
            hit_stop = sequence.output.add(r.token, r.logprobs, r.finish_reason)
            if r.finish_reason is not None:
                self._cache.store(self.spec.key, list(r.all_tokens), r.prompt_cache)
                sequence.output.finish(r.finish_reason)
                finished.append(r.uid)
            elif hit_stop:
                sequence.output.finish("stop")
                stopped.append(r.uid)
        for uid in finished:
            del self._sequences[uid]
        self._remove(stopped, keep_cache=True)
        self._remove(
            [uid for uid, s in self._sequences.items() if s.job.cancelled.is_set()],
            keep_cache=False,
        )
        if finished or stopped:
            self._trim_prompt_cache()

    def close(self) -> None:
        self._sequences.clear()
        self._generator.close()

    def _insert(self, job: GenerationJob, cache: list[Any], hit: CacheHit) -> None:
        tokenizer = self._loaded.tokenizer
        params = job.params
        rest = hit.rest
        (uid,) = self._generator.insert(
            [rest],
            max_tokens=[params.max_tokens],
            caches=[cache],
            all_tokens=[job.prompt[: len(job.prompt) - len(rest)]],
            samplers=[build_sampler(params, tokenizer.all_special_ids, len(tokenizer))],
            logits_processors=[build_logits_processors(params)],
        )
        output = SequenceOutput(job, tokenizer, hit.cached_tokens)
        self._sequences[uid] = _Sequence(job, output, len(rest), time.perf_counter())

    def _prefill_shared(self, jobs: list[GenerationJob], hit: CacheHit) -> CacheHit | None:
        """Process all but the last prompt token into `hit.cache`; None if every job was
        cancelled meanwhile."""
        todo = hit.rest[:-1]
        step = self._limits.prefill_chunk
        for start in range(0, len(todo), step):
            if all(job.cancelled.is_set() for job in jobs):
                return None
            self._loaded.model(mx.array(todo[start : start + step])[None], cache=hit.cache)
            mx.eval([c.state for c in hit.cache])
        return CacheHit(hit.cache, hit.rest[-1:], hit.cached_tokens)

    def _remove(self, uids: list[int], keep_cache: bool) -> None:
        if not uids:
            return
        caches = self._generator.remove(uids, return_prompt_caches=keep_cache)
        for cache, tokens in caches.values():
            self._cache.store(self.spec.key, list(tokens), cache)
        for uid in uids:
            del self._sequences[uid]

    def _trim_prompt_cache(self) -> None:
        """The prompt cache's byte budget covers the caches of running sequences too."""
        budget = self._cache.max_bytes
        if budget is not None:
            self._cache.trim_to(budget - self._generator.prompt_cache_nbytes)

    def _log_progress(self, response) -> None:
        done, total = response.progress
        sequence = self._sequences.get(response.uid)
        if sequence is None or total <= LONG_PROMPT:
            return
        log.info(
            "prompt processing %d/%d tokens (%.1fs)",
            done,
            total,
            time.perf_counter() - sequence.started,
        )

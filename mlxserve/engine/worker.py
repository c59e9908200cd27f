"""The generation thread: the only thread that makes MLX calls.

HTTP threads submit a GenerationJob and read its events from the job's own queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm import stream_generate

from mlxserve.api.errors import APIError, server_error
from mlxserve.engine.prompt_cache import PromptCache
from mlxserve.engine.sampling import (
    GenerationParams,
    build_logits_processors,
    build_sampler,
    reseed_random,
    seed_random,
)
from mlxserve.engine.stops import StopMatcher
from mlxserve.models.provider import LoadedModel, ModelProvider, ModelSpec

log = logging.getLogger(__name__)


@dataclass
class TokenEvent:
    """A generated token and the text that became safe to emit with it (may be empty)."""

    text: str
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


@dataclass
class FinishEvent:
    finish_reason: str  # stop, length, or cancelled
    text: str  # text held back until the end (a partial stop string that never completed)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class ErrorEvent:
    error: APIError


@dataclass
class GenerationJob:
    spec: ModelSpec
    prompt: list[int]
    params: GenerationParams
    num_draft_tokens: int = 3
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class _Cancelled(Exception):
    """Raised from the prefill progress callback to abandon a cancelled job."""


class GenerationWorker:
    def __init__(self, provider: ModelProvider, cache: PromptCache):
        self._provider = provider
        self._cache = cache
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: GenerationJob) -> None:
        self._jobs.put(job)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the generation thread and return its result (or raise its error)."""
        done: queue.Queue = queue.Queue()
        self._jobs.put(lambda: done.put(_capture(fn)))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if callable(job):
                job()
                continue
            try:
                self._generate(job)
            except APIError as e:
                job.events.put(ErrorEvent(e))
            except Exception as e:
                log.exception("generation failed")
                reseed_random()
                job.events.put(ErrorEvent(server_error(f"Generation failed: {e}")))

    def _generate(self, job: GenerationJob) -> None:
        if job.cancelled.is_set():
            return
        loaded = self._activate(job.spec)
        params = job.params
        hit = self._cache.fetch(job.spec.key, _models(loaded), job.prompt)
        if params.seed is not None:
            seed_random(params.seed)
        tokenizer = loaded.tokenizer
        stops = StopMatcher(list(params.stop))
        fed = list(job.prompt)
        completion_tokens = 0
        finish_reason = "cancelled"
        stopped = False  # by a stop string (an EOS finish is "stop" too)
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
                prompt_progress_callback=_progress(job, len(hit.rest)),
            ):
                fed.append(gen.token)
                is_eos = gen.finish_reason == "stop"
                text, stopped = stops.feed(gen.text)
                if not is_eos:
                    completion_tokens += 1
                    job.events.put(_token_event(text, gen, params.logprobs))
                elif text:
                    job.events.put(TokenEvent(text, gen.token))
                if stopped or gen.finish_reason:
                    finish_reason = "stop" if stopped else gen.finish_reason
                    break
                if job.cancelled.is_set():
                    break
        except _Cancelled:
            return
        self._cache.store(job.spec.key, fed, hit.cache)
        job.events.put(
            FinishEvent(
                finish_reason,
                "" if stopped else stops.flush(),  # a partial stop string that never completed
                len(job.prompt),
                completion_tokens,
                hit.cached_tokens,
            )
        )

    def _activate(self, spec: ModelSpec) -> LoadedModel:
        previous = self._provider.loaded
        loaded = self._provider.activate(spec)
        if loaded is not previous:
            self._cache.clear()
        return loaded


def _models(loaded: LoadedModel) -> list[Any]:
    return [loaded.model] + ([loaded.draft_model] if loaded.draft_model is not None else [])


def _token_event(text: str, gen, top: int | None) -> TokenEvent:
    if top is None:
        return TokenEvent(text, gen.token)
    logprobs = gen.logprobs
    top_logprobs = None
    if top > 0:
        ids = mx.argpartition(-logprobs, top - 1)[:top]
        values = logprobs[ids]
        order = mx.argsort(-values)
        top_logprobs = list(zip(ids[order].tolist(), values[order].tolist(), strict=True))
    return TokenEvent(text, gen.token, logprobs[gen.token].item(), top_logprobs)


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


def _capture(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except Exception as e:
        return False, e

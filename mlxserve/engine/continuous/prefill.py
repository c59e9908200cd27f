"""The prompts waiting to join a continuous batch: grouped by prompt, continued from the
prompt cache, and processed a chunk per loop iteration as the scheduler (`scheduler.py`)
gives them budget, until they join; checkpoints kept on the way where the caches continue
only from exact prefixes."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxserve.engine.caches.prompt_cache import PromptCache, cache_bytes
from mlxserve.engine.continuous.row_feature import PromptFailed, RowFeature
from mlxserve.engine.continuous.rows import WaitingPrompt, key_tokens
from mlxserve.engine.continuous.scheduler import plan_prefill
from mlxserve.engine.generation.jobs import ErrorEvent, GenerationJob

log = logging.getLogger(__name__)

LOG_EVERY = 1024  # prompt tokens between two progress lines of a long prompt


class Prefill:
    def __init__(
        self,
        model: Any,
        layers: int,
        cache: PromptCache,
        features: list[RowFeature],
        fresh: Callable[[], list[Any]],
        checkpoints: bool,
        chunk: int,
        clock: Callable[[], float],
    ):
        """`model`: what the batch calls, and `layers` its caches (first in a row's list);
        `features`: the batch's row features; `fresh`: a
        sequence's empty caches; `checkpoints`: the caches continue only from exact
        prefixes (see `ContinuousBatch.checkpoints`); `chunk`: prompt tokens per loop
        iteration; `clock`: what the scheduler reads as now."""
        self._model = model
        self._layers = layers
        self._cache = cache
        self._features = features
        self._fresh = fresh
        self._checkpoints = checkpoints
        self._chunk = chunk
        self._clock = clock
        self.waiting: list[WaitingPrompt] = []

    def jobs(self) -> list[GenerationJob]:
        return [job for waiting in self.waiting for job in waiting.jobs]

    def live_bytes(self) -> int:
        return sum(cache_bytes(waiting.hit.cache) for waiting in self.waiting)

    def ready(self) -> bool:
        """Whether a prompt can be processed now: not when every one waits for work off
        the generation thread (its end wakes the loop)."""
        return any(not any(f.waits(w) for f in self._features) for w in self.waiting)

    def admit(self, job: GenerationJob, key: str) -> None:
        """Queue a job under its prompt-cache `key`. Jobs with the same prompt (a request's
        `n` choices, or a burst of clients sending one prompt) wait together: the prompt is
        processed once and each job continues from a copy of its cache."""
        prompt = key_tokens(job)
        for waiting in self.waiting:
            if key_tokens(waiting.jobs[0]) == prompt and waiting.key == key:
                waiting.jobs.append(job)
                return
        reusable = job.images.reusable if job.images is not None else None
        hit = self._cache.fetch(key, self._fresh, prompt, reusable)
        for feature in self._features:
            feature.fetched(job, hit)
        self.waiting.append(WaitingPrompt([job], hit, self._clock(), key))

    def schedule(self, interactive: bool, free_slots: int, running: bool) -> list[WaitingPrompt]:
        """This iteration's share of prompt processing; the prompts that join the batch
        now (`join` each before its rows are inserted). `interactive`: interactive work
        runs or waits (idle-priority prompts wait)."""
        ready = [w for w in list(self.waiting) if self._ready(w)]
        if interactive:  # idle-priority prompts wait until interactive work is over
            ready = [w for w in ready if not all(job.idle_priority for job in w.jobs)]
        if not ready:
            return []
        now = self._clock()
        # Idle-priority prompts are processed a budget per step even into an empty batch:
        # an interactive request that comes meanwhile waits for one chunk at most.
        idle = any(job.idle_priority for w in ready for job in w.jobs)
        plan = plan_prefill(
            [w.view(now) for w in ready],
            self._chunk,
            free_slots=free_slots,
            batch_empty=not running and not idle,
        )
        if plan.chunk is not None:
            index, tokens = plan.chunk
            self._process_chunk(ready[index], tokens)
        return [ready[i] for i in plan.insert]

    def _ready(self, waiting: WaitingPrompt) -> bool:
        """Whether every feature lets the prompt be processed now; a prompt a feature
        fails is answered (its jobs get the error) and leaves."""
        try:
            return all(f.ready(waiting) for f in self._features)
        except PromptFailed as e:
            self.waiting.remove(waiting)
            for job in waiting.jobs:
                job.emit(ErrorEvent(e.error))
            return False

    def join(self, waiting: WaitingPrompt) -> None:
        """Process the prompt but its last token where the batch cannot take it from
        there (once for all the jobs sharing it: the batch takes the last). A cache that
        cannot be trimmed back is stored here, at the end of the prompt, which is where
        the conversation's next turn continues (the reply it sends back may not be the
        tokens generated)."""
        if not self._checkpoints and not any(f.whole_prompt(waiting) for f in self._features):
            return
        hit = waiting.hit
        self._advance(waiting, len(hit.rest) - 1)
        if self._checkpoints and hit.cached_tokens < len(waiting.processed()):
            self._checkpoint(waiting)

    def _process_chunk(self, waiting: WaitingPrompt, tokens: int) -> None:
        """Process the next `tokens` of a prompt too long to join the batch in one go."""
        self._advance(waiting, tokens)
        total = len(waiting.jobs[0].prompt)
        done = total - len(waiting.hit.rest)
        if done // LOG_EVERY > (done - tokens) // LOG_EVERY:
            elapsed = self._clock() - waiting.arrived
            log.info("prompt processing %d/%d tokens (%.1fs)", done, total, elapsed)

    def _advance(self, waiting: WaitingPrompt, tokens: int) -> None:
        """Process the next `tokens` of a waiting prompt into its cache, keeping a
        checkpoint at each of the job's checkpoint positions passed on the way."""
        hit = waiting.hit
        job = waiting.jobs[0]
        done = len(job.prompt) - len(hit.rest)
        end = done + tokens
        marks = job.checkpoints if self._checkpoints else ()
        for stop in sorted({*(m for m in marks if done < m < end), end}):
            start, count, done = done, stop - done, stop
            if count <= 0:
                continue
            chunk = job.prompt[start:stop]  # tokens, not the image keys in hit.rest
            following = job.prompt[start + 1 : stop + 1]  # each position's next token
            self._forward(waiting, chunk, start, following)
            mx.eval([c.state for c in hit.cache])
            hit.rest = hit.rest[count:]
            if stop in marks:
                self._checkpoint(waiting)

    def _forward(
        self, waiting: WaitingPrompt, tokens: list[int], start: int, following: list[int]
    ) -> None:
        """The model's pass over a chunk (a feature's own, where one has it), then the
        features' caches' (a drafter's)."""
        caches = waiting.hit.cache
        forwarded = None
        for feature in self._features:
            forwarded = feature.forward(waiting, tokens, start, caches)
            if forwarded is not None:
                break
        else:
            self._model(mx.array(tokens)[None], cache=caches[: self._layers])
        hidden = forwarded.hidden if forwarded is not None else None
        for feature in self._features:
            feature.forwarded(tokens, following, caches, hidden)

    def _checkpoint(self, waiting: WaitingPrompt) -> None:
        """Keep a copy of the cache as it is, holding the prompt processed so far."""
        checkpoint = copy.deepcopy(waiting.hit.cache)
        for feature in self._features:
            checkpoint = feature.joining(checkpoint)
        self._cache.store(waiting.key, waiting.processed(), checkpoint)

    def drop_cancelled(self) -> None:
        """Forget waiting prompts whose every job was cancelled; the prompt processed so
        far is kept in the prompt cache."""
        for waiting in list(self.waiting):
            if all(job.cancelled.is_set() for job in waiting.jobs):
                self.waiting.remove(waiting)
                if waiting.hit.cached_tokens < len(waiting.processed()):
                    self._cache.store(waiting.key, waiting.processed(), waiting.hit.cache)

"""The continuous batch: one loaded model's requests decoding together, on mlx-lm's
BatchGenerator.

Admitted requests wait until the scheduler gives them prompt-processing budget (see
`prefill` and `scheduler`); then they join the running batch, each with its own sampler,
logits processors, stop strings, logprobs and token limit. A sequence that finishes, hits a
stop string or is cancelled leaves the batch at once and its KV cache goes to the prompt
cache. How rows vary (vision rows, adapters, drafters, KV quantization, lockstep) is each a
row feature (`row_feature.py`, picked by `features.py`); idle-priority rows leave the batch
while interactive work runs (`parking.py`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxserve.compat import settle
from mlxserve.engine.caches.prompt_cache import CacheHit, PromptCache
from mlxserve.engine.continuous.batch_model import batch_model
from mlxserve.engine.continuous.drafting import sequence_caches
from mlxserve.engine.continuous.features import row_features
from mlxserve.engine.continuous.parking import IdleParking
from mlxserve.engine.continuous.prefill import Prefill
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.engine.continuous.rows import Row, reserved_tokens
from mlxserve.engine.generation.jobs import GenerationJob
from mlxserve.engine.generation.sampling import build_logits_processors, build_sampler
from mlxserve.engine.generation.sequence import SequenceOutput
from mlxserve.engine.memory.footprint import KVFootprint, measure_footprint
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.models.spec import ModelSpec


def can_batch(loaded: LoadedModel) -> bool:
    """Batching (mlx-lm's BatchGenerator) needs a model whose caches merge into batch
    caches (a vision model's language model's too, see `vision_model`)."""
    model = batch_model(loaded.model, loaded.spec.vision)
    return all(hasattr(c, "merge") for c in sequence_caches(model, loaded.draft_model))


def _exact_prefix_only(cache: Any) -> bool:
    """Whether a cache cannot always be trimmed back to an earlier position (a hybrid
    model's recurrent state, a sliding window once wrapped)."""
    return type(cache) is not KVCache and not isinstance(cache, RowEntry)


@dataclass(frozen=True)
class ContinuousBatchLimits:
    """The batch's share of the server's settings (their defaults: `config.ServerConfig`)."""

    decode: int  # sequences decoding together
    prefill_chunk: int  # prompt tokens processed per loop iteration
    kv_bits: int | None  # KV caches quantized to this many bits (None: not)
    kv_group_size: int
    speculation: str  # prompt-lookup drafts: "auto" where they pay, "on", "off"
    max_draft: int  # the most tokens drafted per sequence and step
    mtp: str = "off"  # the model's MTP head drafts: "auto" where they pay, "on", "off"


class ContinuousBatch:
    """A `loop.model_session.Session`."""

    def __init__(
        self,
        loaded: LoadedModel,
        cache: PromptCache,
        limits: ContinuousBatchLimits,
        trim_prompt_cache: Callable[[], None],
        draft_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
        worst: Callable[[float], float] | None = None,
        wake: Callable[[], None] = lambda: None,
    ):
        """`trim_prompt_cache`: called when KV caches grew or were set free, for the
        prompt cache to give way within the budget (the worker knows every model's);
        `draft_tokens`: drafted per step by the model's draft model, if it has one;
        `clock`: what the scheduler reads as now; `worst`: where ranks run this batch in
        lockstep, the largest of every rank's value of a measurement (see
        engine.loop.loop_step); `wake`: wakes the generation loop, waiting for work, when
        a prompt's images are through the vision encoder."""
        self._loaded = loaded
        self._cache = cache
        self._limits = limits
        self._trim_prompt_cache = trim_prompt_cache
        self._rows: dict[int, Row] = {}  # running, by uid
        rows = row_features(loaded, limits, draft_tokens, worst, wake, lambda: bool(self._rows))
        self._model, self._features = rows.model, rows.features
        self._drafting, self._lockstep = rows.drafting, rows.lockstep
        self._layers = len(make_prompt_cache(self._model))  # the model's own caches
        # Entries of another layout must never meet this one's (the disk tier outlives us).
        self._key = loaded.spec.key + "".join(f.key for f in self._features)
        fresh = self._fresh()
        # Caches that cannot always be trimmed back (a hybrid model's recurrent state, a
        # sliding window once wrapped) are reusable only from an exact prefix.
        # (A pipeline rank holds some of the layers: every rank takes the model's answer.)
        self.checkpoints = bool(rows.worst(any(_exact_prefix_only(c) for c in fresh)))
        self.footprint = self._measured(fresh)
        self._generator = BatchGenerator(
            self._drafting.called,
            stop_tokens=[[t] for t in sorted(loaded.tokenizer.eos_token_ids)],
            completion_batch_size=limits.decode,
            prefill_batch_size=limits.decode,  # the scheduler decides what joins together
            prefill_step_size=limits.prefill_chunk,
        )
        self.speculation = self._drafting.install(self._generator)
        self._prefill = Prefill(
            self._model,
            self._layers,
            cache,
            self._features,
            self._fresh,
            self.checkpoints,
            limits.prefill_chunk,
            clock,
        )
        whole = all(f.parks for f in self._features)
        self._parking = IdleParking(self._generator, self._rows, cache, self._remove, whole)

    def _fresh(self) -> list[Any]:
        """A sequence's empty caches: the model's, then its features' (a drafter's)."""
        return [*make_prompt_cache(self._model), *(c for f in self._features for c in f.caches())]

    def _measured(self, fresh: list[Any]) -> KVFootprint:
        """The KV bytes of a sequence, as its caches are in the batch."""
        for feature in self._features:
            fresh = feature.joining(fresh)
        try:
            footprint = measure_footprint(self._model, fresh[: self._layers])
            drafter = self._drafting.footprint(fresh[self._layers :])
        except ValueError as e:  # a layout a feature cannot take
            refusal = next((r for f in self._features if (r := f.refused(e)) is not None), None)
            if refusal is None:
                raise
            raise refusal from e
        return footprint + drafter if drafter is not None else footprint

    @property
    def spec(self) -> ModelSpec:
        return self._loaded.spec

    @property
    def weight_bytes(self) -> int:
        return self._loaded.nbytes

    @property
    def trace(self) -> int:
        """A hash of every (sequence, token) generated, in order: kept where ranks run in
        lockstep (rank 0's is checked against the others' every step), else 0."""
        return self._lockstep.trace if self._lockstep is not None else 0

    def __len__(self) -> int:
        """Jobs running or waiting to run."""
        return len(self._rows) + len(self._prefill.jobs()) + len(self._parking)

    @property
    def decoding(self) -> int:
        """Jobs past their prompt, generating."""
        return len(self._rows)

    @property
    def idle_slots(self) -> int:
        """Decode slots idle-priority work may take: none while interactive work runs or
        waits here, else those no job holds."""
        return 0 if self._interactive() else self._limits.decode - len(self)

    def jobs(self) -> list[GenerationJob]:
        running = [row.job for row in self._rows.values()]
        return running + self._prefill.jobs() + self._parking.jobs()

    def fits(self, jobs: list[GenerationJob], room: int | None) -> bool:
        """Whether `jobs` can join without the batch's KV caches, grown to every job's
        prompt + max_tokens, taking more than `room` bytes (None: no bound)."""
        if room is None:
            return True
        lengths = [reserved_tokens(job) for job in [*self.jobs(), *jobs]]
        return self.footprint.batch(lengths) <= room

    def reserved_bytes(self) -> int:
        """The KV bytes the batch may grow to: every job at its prompt + max_tokens."""
        jobs = self.jobs()
        return self.footprint.batch([reserved_tokens(job) for job in jobs]) if jobs else 0

    def live_bytes(self) -> int:
        """The KV bytes held now: the running batch's caches, the waiting prompts' and the
        parked rows' (and what features hold beside: a vision model's image features)."""
        running = self._generator.prompt_cache_nbytes
        features = sum(f.live_bytes() for f in self._features)
        return running + self._prefill.live_bytes() + self._parking.live_bytes() + features

    def ready(self) -> bool:
        """Whether a step would do anything now: not when every waiting prompt waits for
        work off the loop (the vision encoder; its end wakes the loop)."""
        return bool(self._rows) or self._parking.parked or self._prefill.ready()

    def admit(self, job: GenerationJob) -> None:
        """Queue a job (see `Prefill.admit`)."""
        key = self._key + "".join(f.prompt_key(job) for f in self._features)
        self._prefill.admit(job, key)
        self._trim_prompt_cache()

    def step(self) -> None:
        """One loop iteration: the scheduler's share of prompt processing, then one decode
        step for every running sequence (where only idle-priority rows run, the rows
        joining them instead, a part at a time: `JoinsApart`)."""
        self._prefill.drop_cancelled()
        interactive = self._interactive()
        # A join under way goes a part further before the scheduler starts more rows
        # (their prompt pass would share the generator's call with its first pass).
        apart = self._parking.arrange(interactive)
        if apart and self._parking.joins.step():
            return
        self._schedule(interactive)
        if not self._rows:
            return
        if apart and self._parking.joins.step():
            return
        _, responses = self._generator.next()
        for feature in self._features:
            feature.stepped(responses)
        finished: list[int] = []
        stopped: list[int] = []
        for r in responses:  # a sequence may have several tokens in one step (speculation)
            if r.uid in finished or r.uid in stopped:
                continue  # the tokens after its stop string are not output
            row = self._rows[r.uid]
            hit_stop = row.output.add(r.token, r.logprobs, r.finish_reason)
            if r.finish_reason is not None:
                self._cache.store(row.key, row.key_tokens(r.all_tokens), r.prompt_cache)
                row.output.finish(r.finish_reason)
                finished.append(r.uid)
            elif hit_stop:
                row.output.finish("stop")
                stopped.append(r.uid)
        for uid in finished:
            del self._rows[uid]
        for uid, row in self._rows.items():
            if uid not in stopped and row.job.finish_requested.is_set():
                row.output.finish("stop")
                stopped.append(uid)
        self._remove(stopped, keep_cache=True)
        cancelled = [uid for uid, row in self._rows.items() if row.job.cancelled.is_set()]
        self._remove(cancelled, keep_cache=False)
        if finished or stopped:
            self._trim_prompt_cache()
        if self._rows and not self._interactive():
            # Idle-priority rows alone: nothing runs between their steps, so interactive
            # work that comes waits for the step running then, not the one after it too.
            settle(self._generator)

    def _schedule(self, interactive: bool) -> None:
        """`interactive`: interactive work runs or waits (idle-priority prompts wait)."""
        free_slots = self._limits.decode - len(self._rows)
        for waiting in self._prefill.schedule(interactive, free_slots, bool(self._rows)):
            jobs = [job for job in waiting.jobs if not job.cancelled.is_set()]
            self._prefill.join(waiting)
            hit = waiting.hit
            for i, job in enumerate(jobs):
                cache = hit.cache if i == len(jobs) - 1 else copy.deepcopy(hit.cache)
                self._insert(job, cache, hit, waiting.key)
            # Only now: if an insertion fails, its jobs are still found (and answered).
            self._prefill.waiting.remove(waiting)

    def _insert(self, job: GenerationJob, cache: list[Any], hit: CacheHit, key: str) -> None:
        tokenizer = self._loaded.tokenizer
        params = job.params
        rest = job.prompt[len(job.prompt) - len(hit.rest) :]  # real tokens, not image keys
        for feature in self._features:
            cache = feature.joining(cache)
        (uid,) = self._generator.insert(
            [rest],
            max_tokens=[params.max_tokens],
            caches=[cache],
            all_tokens=[job.prompt[: len(job.prompt) - len(rest)]],
            samplers=[build_sampler(params, tokenizer.all_special_ids, len(tokenizer))],
            logits_processors=[build_logits_processors(params)],
        )
        self._rows[uid] = Row(job, SequenceOutput(job, tokenizer, hit), key)

    def _remove(self, uids: list[int], keep_cache: bool) -> None:
        if not uids:
            return
        caches = self._generator.remove(uids, return_prompt_caches=keep_cache)
        for uid, (cache, tokens) in caches.items():
            row = self._rows[uid]
            self._cache.store(row.key, row.key_tokens(tokens), cache)
        for uid in uids:
            del self._rows[uid]

    def preempt_idle(self) -> None:
        """End every idle-priority job (interactive work wants their memory), keeping what
        their rows processed in the prompt cache."""
        self._parking.preempt(self._prefill.jobs())
        self._prefill.drop_cancelled()
        self._parking.end()

    def _interactive(self) -> bool:
        """Whether interactive (not idle-priority) work runs or waits here."""
        running = (row.job for row in self._rows.values())
        return any(
            not job.idle_priority and not job.cancelled.is_set()
            for job in [*running, *self._prefill.jobs()]
        )

    def close(self) -> None:
        self._rows.clear()
        self._prefill.waiting.clear()
        self._parking.close()
        self._generator.close()
        for feature in self._features:
            feature.close()

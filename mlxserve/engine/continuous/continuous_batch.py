"""The continuous batch: one loaded model's requests decoding together, on mlx-lm's
BatchGenerator.

Admitted requests wait until the scheduler gives them prompt-processing budget (see
`scheduler`); then they join the running batch, each with its own sampler, logits
processors, stop strings, logprobs and token limit. A sequence that finishes, hits a stop
string or is cancelled leaves the batch at once and its KV cache goes to the prompt cache.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from mlxserve.adapters.layers import BASE
from mlxserve.compat import generation_batch, install_generation_batch, settle
from mlxserve.drafters.dflash import DFlashDrafter
from mlxserve.drafters.hidden import HiddenCapture, splits_exactly
from mlxserve.engine.caches.prompt_cache import CacheHit, PromptCache, cache_bytes
from mlxserve.engine.caches.quantized_cache import KVQuantization
from mlxserve.engine.continuous.adapter_rows import ADAPTER_ROWS_KEY, AdapterRowsModel, with_slot
from mlxserve.engine.continuous.idle_joins import JoinsApart
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.engine.continuous.scheduler import Waiting, plan_prefill
from mlxserve.engine.continuous.vision_rows import (
    Encoder,
    VisionArraysCache,
    VisionHiddenCapture,
    VisionRow,
    batch_model,
)
from mlxserve.engine.generation.jobs import ErrorEvent, GenerationJob
from mlxserve.engine.generation.sampling import build_logits_processors, build_sampler
from mlxserve.engine.generation.sequence import SequenceOutput
from mlxserve.engine.memory.footprint import measure_footprint
from mlxserve.engine.speculation.block_drafts import draft_in_blocks
from mlxserve.engine.speculation.draft_costs import DraftCosts, Drafting, chained
from mlxserve.engine.speculation.draft_model import draft_with_model
from mlxserve.engine.speculation.head_drafts import draft_with_head
from mlxserve.engine.speculation.recurrent_steps import records_steps
from mlxserve.engine.speculation.speculation_plan import (
    SpeculationFeatures,
    SpeculationPlan,
    plan_speculation,
)
from mlxserve.engine.speculation.verify import SpeculationCounts, empty_sibling, speculate_in
from mlxserve.models.provider import LoadedModel
from mlxserve.protocol.errors import bad_request, internal_error

log = logging.getLogger(__name__)

LOG_EVERY = 1024  # prompt tokens between two progress lines of a long prompt
# Where ranks run in lockstep: how often rank 0, its images encoded, asks whether the
# other ranks are done too while nothing else runs (each ask is a published step)
ENCODING_ELSEWHERE_POLL_SECONDS = 0.005
# The caches (as a sequence makes them) whose batch caches drop a pass's rejected drafts:
# cut off, or (recurrent states, mlx-lm's and a vision model's) taken from the pass's
# records or again from where it began.
ROLLS_BACK = (KVCache, RotatingKVCache, ArraysCache, VisionArraysCache)


def reserved_tokens(job: GenerationJob) -> int:
    """The most tokens a job's KV cache can hold."""
    return len(job.prompt) + job.params.max_tokens


def can_batch(loaded: LoadedModel) -> bool:
    """Batching (mlx-lm's BatchGenerator) needs a model whose caches merge into batch
    caches (a vision model's language model's too, see `vision_rows`)."""
    model = batch_model(loaded.model, loaded.spec.vision)
    return all(hasattr(c, "merge") for c in _fresh_caches(model, loaded, None))


def drops_drafts(loaded: LoadedModel) -> bool:
    """Whether the model's and its draft model's caches can drop the drafts the model
    rejects (`can_roll_back`: full attention, sliding windows and recurrent
    layers, mlx-lm's and mlx-vlm's; not Llama 4's chunked attention)."""
    model = batch_model(loaded.model, loaded.spec.vision)
    return can_roll_back(_fresh_caches(model, loaded, None))


def can_roll_back(caches: list[Any]) -> bool:
    """Whether a sequence's caches can drop rejected drafts: attention caches are trimmed,
    sliding windows too (a pass over several tokens overwrites nothing: see
    `compat.roll_back_window`); recurrent states are taken from the pass's records
    (`recurrent_steps`) or again from where it began (`SpeculativeBatch._replay`); a vision
    row's RoPE delta and a row's adapter hold no positions."""
    return all(type(c) in ROLLS_BACK or isinstance(c, RowEntry) for c in caches)


def _fresh_caches(model: Any, loaded: LoadedModel, head: Any) -> list[Any]:
    """A sequence's empty caches: the model's (as the batch calls it, see `batch_model`),
    then its draft model's or MTP head's."""
    models = [model, loaded.draft_model, head]
    return [c for m in models if m is not None for c in make_prompt_cache(m)]


def _key_tokens(job: GenerationJob) -> list[int]:
    """The prompt as the prompt cache knows it: a vision prompt's images stand as ids
    hashed from their bytes (see `PromptImages.cache_tokens`)."""
    return job.images.cache_tokens if job.images is not None else job.prompt


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


@dataclass
class _Sequence:
    job: GenerationJob
    output: SequenceOutput
    key: str  # its prompt-cache key: the model's, and its adapter's

    def key_tokens(self, tokens: list[int]) -> list[int]:
        """The sequence's tokens (its prompt, then what it generated) as the prompt cache
        keys them."""
        return _key_tokens(self.job) + list(tokens[len(self.job.prompt) :])


@dataclass(eq=False)
class _Parked:
    """Idle-priority rows out of the batch while interactive work runs: mlx-lm's batch that
    held them, set aside whole. It keeps everything each row needs to go on exactly as if
    it had never stopped (caches, the token it sampled last, sampler, processors, drafting
    state), and coming back costs nothing: no row's caches are taken out or merged again
    (row by row, that cost 32 rows 0.3 s on a CPU, an interactive request's wait)."""

    batch: GenerationBatch
    sequences: dict[int, _Sequence]  # by uid, as the batch holds them


@dataclass(eq=False)
class _Admitted:
    """Jobs with one prompt, waiting for their turn; `hit.rest` shrinks as chunks of the
    prompt are processed into `hit.cache`."""

    jobs: list[GenerationJob]
    hit: CacheHit
    arrived: float
    key: str  # the prompt-cache key: the model's, and the jobs' adapter's
    vision: VisionRow | None = None  # a vision model's row, once its images are encoded
    encoding: Future[VisionRow] | None = None  # its images in the encoder meanwhile

    def view(self, now: float) -> Waiting:
        return Waiting(len(self.hit.rest), len(self.jobs), now - self.arrived)

    def processed(self) -> list[int]:
        """The prompt's tokens processed so far, as the prompt cache keys them."""
        prompt = _key_tokens(self.jobs[0])
        return prompt[: len(prompt) - len(self.hit.rest)]


class ContinuousBatch:
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
        engine.loop.loop_step); `wake`: wakes the generation loop, waiting for work, when a
        prompt's images are through the vision encoder."""
        self._loaded = loaded
        # what the batch calls; a text model's rows each under their own adapter (or none)
        self._model = batch_model(loaded.model, loaded.spec.vision)
        self._adapters = loaded.adapters if worst is None else None  # not across ranks
        if self._adapters is not None:
            self._model = AdapterRowsModel(self._model, self._adapters)
        self._encoder = Encoder(wake) if loaded.spec.vision else None
        self._clock = clock
        self._worst = worst or (lambda value: value)
        self._traced = worst is not None  # ranks run this batch in lockstep
        self._layers = len(make_prompt_cache(self._model))  # the model's own caches
        self._draft_tokens = draft_tokens
        self._cache = cache
        self._limits = limits
        self._costs: dict[tuple[int, bool], DraftCosts] = {}  # see `_draft_costs`
        self._plan = self._plan_speculation()
        # drafting from the model's hidden states
        self._head: Any = loaded.head if self._plan.head else None
        self._capture: Any = None
        if self._head is not None and loaded.spec.vision:
            self._capture = VisionHiddenCapture(self._model)
        elif self._head is not None:
            self._capture = HiddenCapture(loaded.model, self._head.reads)
            if self._adapters is not None:
                self._capture = AdapterRowsModel(self._capture, self._adapters)
        self._trim_prompt_cache = trim_prompt_cache
        self._quantization = (
            KVQuantization(limits.kv_bits, limits.kv_group_size) if limits.kv_bits else None
        )
        # Entries of another KV layout must never meet this one's (the disk tier outlives us).
        self._key = (
            loaded.spec.key
            + (f"|kv{limits.kv_bits}/{limits.kv_group_size}" if limits.kv_bits else "")
            + ("|head" if self._head is not None else "")
            + (ADAPTER_ROWS_KEY if self._adapters is not None else "")
        )
        try:
            fresh = self._fresh()
            # Caches that cannot always be trimmed back (a hybrid model's recurrent state,
            # a sliding window once wrapped) are reusable only from an exact prefix.
            # (A pipeline rank holds some of the layers: every rank takes the model's answer.)
            self.checkpoints = bool(self._worst(any(_exact_prefix_only(c) for c in fresh)))
            if self._quantization is not None:
                fresh = self._quantization.quantized(fresh)
            self.footprint = measure_footprint(self._model, fresh[: self._layers])
            if loaded.draft_model is not None:
                self.footprint += measure_footprint(loaded.draft_model, fresh[self._layers :])
            if self._head is not None:
                self.footprint += measure_footprint(self._head.as_model(), fresh[self._layers :])
        except ValueError as e:  # a head that cannot be split into quantization groups
            if self._quantization is None:
                raise
            raise bad_request(
                f"This model's KV cache cannot be quantized with --kv-bits "
                f"{limits.kv_bits} --kv-group-size {limits.kv_group_size}: {e}"
            ) from e
        tokenizer = loaded.tokenizer
        self._generator = BatchGenerator(
            cast(Any, self._capture) if self._capture is not None else self._model,
            stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
            completion_batch_size=limits.decode,
            prefill_batch_size=limits.decode,  # the scheduler decides what joins together
            prefill_step_size=limits.prefill_chunk,
        )
        self.speculation = self._speculate()
        self._sequences: dict[int, _Sequence] = {}
        self._admitted: list[_Admitted] = []
        self._parked: _Parked | None = None
        # Idle-priority rows can leave the batch and come back exactly where the caches
        # hold all a row's state (no drafter's or vision encoder's beside them); rows
        # joining them, likewise, are taken through their prompt apart (idle_joins.py).
        self._parks = (
            loaded.draft_model is None
            and self._head is None
            and not loaded.spec.vision
            and self._quantization is None
        )
        self._joins = JoinsApart(self._generator)
        # A hash of every (sequence, token) generated, in order: kept where ranks run in
        # lockstep (rank 0's is checked against the others' every step), else 0.
        self.trace = 0

    def _plan_speculation(self) -> SpeculationPlan:
        """What drafts this batch verifies (speculation_plan.py's table)."""
        loaded, limits, head = self._loaded, self._limits, self._loaded.head
        draft_tokens = self._draft_tokens
        if isinstance(head, DFlashDrafter):
            draft_tokens = head.block - 1  # it guesses its block less one
        features = SpeculationFeatures(
            name=self.spec.path.name,
            draft_model=loaded.draft_model is not None,
            head=head.name if head is not None else None,
            head_asked=head is not None and head.reads is not None,  # an EAGLE-3 drafter
            rolls_back=can_roll_back(make_prompt_cache(self._model)),
            # a vision model's capture reads the hidden states its output head reads
            head_splits=head is not None and (loaded.spec.vision or splits_exactly(loaded.model)),
            kv_quantized=bool(limits.kv_bits),
            lockstep=self._traced,
            draft_tokens=draft_tokens,
            mtp=limits.mtp,
            lookup=limits.speculation,
            max_draft=limits.max_draft,
        )
        return plan_speculation(features, self._pays)

    def _speculate(self) -> SpeculationCounts | None:
        """Start verifying the planned drafts in the decode step (a hybrid model's
        recurrent layers keeping their state at each position they verify). Where the
        device decides (`--speculation auto` for prompt lookup and a drafter named by
        --draft-model, `--mtp auto` for the checkpoint's head), each row's draft is no
        longer than the measured costs pay for at its acceptance, and none where no
        length pays; elsewhere (`on`, and `off` beside a named drafter) every row drafts
        as much as its acceptance says."""
        plan, draft_model, limits = self._plan, self._loaded.draft_model, self._limits
        records_steps(self._loaded.model)
        auto = limits.speculation == "auto"  # lookup's and a named drafter's lengths
        if plan.draft_model and draft_model is not None:
            costs = self._costs_if(auto, self._draft_tokens + 1, chained(draft_model))
            return draft_with_model(self._generator, self._draft_tokens, draft_model, costs)
        if isinstance(self._head, DFlashDrafter):
            costs = self._costs_if(auto, self._head.block, self._head.drafting)
            return draft_in_blocks(self._generator, self._head, self._head.block - 1, costs)
        if self._head is not None:
            max_draft = limits.max_draft if plan.lookup else 0
            decides = auto if self._head.reads is not None else limits.mtp == "auto"
            drafting = chained(self._head.as_model())
            costs = self._costs_if(decides, self._draft_tokens + 1, drafting)
            return draft_with_head(
                self._generator, self._head, self._draft_tokens, max_draft, costs
            )
        if not plan.lookup:
            return None
        costs = self._costs_if(auto, limits.max_draft + 1)
        return speculate_in(self._generator, limits.max_draft, costs)

    def _pays(self, width: int, with_head: bool) -> bool:
        """Whether verifying `width` tokens (drafted by the head, if `with_head`) costs
        this device at most half the steps it can save."""
        head = self._loaded.head
        drafting = chained(head.as_model()) if with_head and head is not None else None
        cost = self._draft_costs(width, drafting).of(width)
        return cost <= width / 2

    def _costs_if(
        self, measured: bool, widest: int, drafting: Drafting | None = None
    ) -> DraftCosts:
        """The costs a batch's draft lengths follow: measured (`_draft_costs`) where the
        device decides, else none (every pass a step: every row drafts)."""
        return self._draft_costs(widest, drafting) if measured else DraftCosts()

    def _draft_costs(self, widest: int, drafting: Drafting | None = None) -> DraftCosts:
        """What verifying up to `widest` tokens costs this device, with a drafter's
        guesses (`drafting`) if given: measured once (the worst rank's where ranks run
        in lockstep)."""
        key = (widest, drafting is not None)
        if key not in self._costs:
            costs = DraftCosts.measured(self._model, widest, drafting, self._worst)
            log.info(
                "Drafting and verifying %d tokens costs %.1f steps of one on this device",
                widest,
                costs.of(widest),
            )
            self._costs[key] = costs
        return self._costs[key]

    @property
    def spec(self):
        return self._loaded.spec

    @property
    def weight_bytes(self) -> int:
        return self._loaded.nbytes

    def __len__(self) -> int:
        """Jobs running or waiting to run."""
        waiting = sum(len(a.jobs) for a in self._admitted)
        parked = len(self._parked.sequences) if self._parked is not None else 0
        return len(self._sequences) + waiting + parked

    @property
    def decoding(self) -> int:
        """Jobs past their prompt, generating."""
        return len(self._sequences)

    @property
    def idle_slots(self) -> int:
        """Decode slots idle-priority work may take: none while interactive work runs or
        waits here, else those no job holds."""
        return 0 if self._interactive() else self._limits.decode - len(self)

    def jobs(self) -> list[GenerationJob]:
        parked = self._parked.sequences.values() if self._parked is not None else ()
        return (
            [s.job for s in self._sequences.values()]
            + [job for a in self._admitted for job in a.jobs]
            + [s.job for s in parked]
        )

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
        """The KV bytes held now: the running batch's caches and the waiting prompts' (and
        a vision model's kept image features)."""
        waiting = sum(cache_bytes(a.hit.cache) for a in self._admitted)
        if self._parked is not None:
            waiting += cache_bytes(self._parked.batch.prompt_cache)
        features = self._model.features.nbytes if self._loaded.spec.vision else 0
        joining = self._joins.nbytes()
        return self._generator.prompt_cache_nbytes + waiting + features + joining

    def admit(self, job: GenerationJob) -> None:
        """Queue a job. Jobs with the same prompt (a request's `n` choices, or a burst of
        clients sending one prompt) wait together: the prompt is processed once and each
        job continues from a copy of its cache."""
        prompt = _key_tokens(job)
        slot, key = self._adapter_of(job)
        for admitted in self._admitted:
            if _key_tokens(admitted.jobs[0]) == prompt and admitted.key == key:
                admitted.jobs.append(job)
                return
        reusable = job.images.reusable if job.images is not None else None
        hit = self._cache.fetch(key, self._fresh, prompt, reusable)
        if self._adapters is not None:  # the entry's slot may be another run's
            hit.cache = with_slot(hit.cache, self._model.index, slot)
        if self._quantization is not None and hit.rest:
            hit.cache = self._quantization.plain(hit.cache)
        self._admitted.append(_Admitted([job], hit, self._clock(), key))
        self._trim_prompt_cache()

    def _adapter_of(self, job: GenerationJob) -> tuple[int, str]:
        """The adapter slot a job's rows use and its prompt-cache key (residency.py made
        its adapter resident before it was admitted)."""
        if job.adapter is None:
            return BASE, self._key
        resident = self._adapters.get(job.adapter) if self._adapters is not None else None
        if resident is None:
            raise bad_request(
                f"The adapter '{job.adapter}' is not loaded on {self.spec.path.name}.",
                param="model",
                code="adapter_not_loaded",
            )
        return resident.slot, self._key + resident.cache_key

    def step(self) -> None:
        """One loop iteration: the scheduler's share of prompt processing, then one decode
        step for every running sequence (where only idle-priority rows run, the rows
        joining them instead, a part at a time: `JoinsApart`)."""
        self._drop_cancelled_admissions()
        self._end_parked()
        interactive = self._interactive()
        if interactive:
            self._park_idle()
        else:
            self._resume_parked()
        # Rows join apart where only idle-priority rows run and could be parked whole;
        # elsewhere rows through their first pass join the running batch now. A join
        # under way goes a part further before the scheduler starts more rows (their
        # prompt pass would share the generator's call with its first pass).
        apart = not interactive and self._parks and bool(generation_batch(self._generator))
        if not apart:
            self._joins.merge()
        elif self._joins.step():
            return
        self._schedule(interactive)
        if not self._sequences:
            return
        if apart and self._joins.step():
            return
        _, responses = self._generator.next()
        finished: list[int] = []
        stopped: list[int] = []
        for r in responses:  # a sequence may have several tokens in one step (speculation)
            if self._traced:
                self.trace = hash((self.trace, r.uid, r.token))
            if r.uid in finished or r.uid in stopped:
                continue  # the tokens after its stop string are not output
            sequence = self._sequences[r.uid]
            hit_stop = sequence.output.add(r.token, r.logprobs, r.finish_reason)
            if r.finish_reason is not None:
                self._cache.store(sequence.key, sequence.key_tokens(r.all_tokens), r.prompt_cache)
                sequence.output.finish(r.finish_reason)
                finished.append(r.uid)
            elif hit_stop:
                sequence.output.finish("stop")
                stopped.append(r.uid)
        for uid in finished:
            del self._sequences[uid]
        for uid, sequence in self._sequences.items():
            if uid not in stopped and sequence.job.finish_requested.is_set():
                sequence.output.finish("stop")
                stopped.append(uid)
        self._remove(stopped, keep_cache=True)
        self._remove(
            [uid for uid, s in self._sequences.items() if s.job.cancelled.is_set()],
            keep_cache=False,
        )
        if finished or stopped:
            self._trim_prompt_cache()
        if self._sequences and not self._interactive():
            # Idle-priority rows alone: nothing runs between their steps, so interactive
            # work that comes waits for the step running then, not the one after it too.
            settle(self._generator)

    def preempt_idle(self) -> None:
        """End every idle-priority job (interactive work wants their memory), keeping what
        their rows processed in the prompt cache."""
        self._joins.merge()
        rows = [uid for uid, s in self._sequences.items() if s.job.idle_priority]
        for uid in rows:
            self._sequences[uid].job.preempt()
        self._remove(rows, keep_cache=True)
        waiting = [job for a in self._admitted for job in a.jobs]
        parked = self._parked.sequences.values() if self._parked is not None else ()
        for job in [*waiting, *(s.job for s in parked)]:
            if job.idle_priority and not job.cancelled.is_set():
                job.preempt()
        self._drop_cancelled_admissions()
        self._end_parked()

    def _interactive(self) -> bool:
        """Whether interactive (not idle-priority) work runs or waits here."""
        running = (s.job for s in self._sequences.values())
        waiting = (job for a in self._admitted for job in a.jobs)
        return any(
            not job.idle_priority and not job.cancelled.is_set() for job in [*running, *waiting]
        )

    def _park_idle(self) -> None:
        """Interactive work runs alone: idle-priority rows leave the batch, keeping their
        state, until it is over. Where the batch holds only such rows and their state is
        all in it, the whole batch is set aside (`_Parked`); otherwise (a row in mlx-lm's
        prompt stage, a drafter's or vision encoder's state beside the caches) a row ends
        with `preempted` and runs again from the prompt cache."""
        self._joins.merge()
        rows = [uid for uid, s in self._sequences.items() if s.job.idle_priority]
        if not rows:
            return
        log.info("%d batch rows pause while interactive work runs", len(rows))
        batch = generation_batch(self._generator)
        whole = self._parks and self._parked is None and set(batch.uids) <= set(rows)
        parks = list(batch.uids) if whole else []
        others = [uid for uid in rows if uid not in parks]
        for uid in others:
            self._sequences[uid].job.preempt()
        self._remove(others, keep_cache=True)
        if parks:
            install_generation_batch(self._generator, empty_sibling(batch))
            self._parked = _Parked(batch, {uid: self._sequences.pop(uid) for uid in parks})

    def _resume_parked(self) -> None:
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
        self._sequences.update(parked.sequences)

    def _end_parked(self) -> None:
        """Parked rows whose client left are dropped; those whose client has what it
        wants end as stopped (their last sampled token not output), caches kept."""
        if self._parked is None:
            return
        batch, sequences = self._parked.batch, self._parked.sequences
        keep = []
        for row, uid in enumerate(batch.uids):
            sequence = sequences[uid]
            job = sequence.job
            if not job.cancelled.is_set() and not job.finish_requested.is_set():
                keep.append(row)
                continue
            if not job.cancelled.is_set():  # its client has what it wants
                key = sequence.key_tokens(batch.tokens[row])
                self._cache.store(sequence.key, key, batch.extract_cache(row))
                sequence.output.finish("stop")
            del sequences[uid]
        if len(keep) < len(batch.uids):
            batch.filter(keep)
        if not sequences:
            self._parked = None

    def close(self) -> None:
        self._sequences.clear()
        self._admitted.clear()
        self._parked = None
        self._joins.clear()
        self._generator.close()
        if self._encoder is not None:
            self._encoder.close()

    def ready(self) -> bool:
        """Whether a step would do anything now: not when every waiting prompt waits for
        the vision encoder (its end wakes the loop)."""
        return (
            bool(self._sequences)
            or self._parked is not None
            or any(a.encoding is None or a.encoding.done() for a in self._admitted)
        )

    def _schedule(self, interactive: bool) -> None:
        """`interactive`: interactive work runs or waits (idle-priority prompts wait)."""
        ready = [a for a in list(self._admitted) if self._encoded(a)]
        if interactive:  # idle-priority prompts wait until interactive work is over
            ready = [a for a in ready if not all(job.idle_priority for job in a.jobs)]
        if not ready:
            return
        now = self._clock()
        # Idle-priority prompts are processed a budget per step even into an empty batch:
        # an interactive request that comes meanwhile waits for one chunk at most.
        idle = any(job.idle_priority for a in ready for job in a.jobs)
        plan = plan_prefill(
            [a.view(now) for a in ready],
            self._limits.prefill_chunk,
            free_slots=self._limits.decode - len(self._sequences),
            batch_empty=not self._sequences and not idle,
        )
        if plan.chunk is not None:
            index, tokens = plan.chunk
            self._process_chunk(ready[index], tokens)
        for admitted in [ready[i] for i in plan.insert]:
            jobs = [job for job in admitted.jobs if not job.cancelled.is_set()]
            # The draft model's caches take the prompt here too (the batch feeds only the
            # model), and so does a vision row's language model where images remain (the
            # batch feeds tokens; text after the images it places by the row's RoPE delta).
            drafter = self._loaded.draft_model is not None or self._head is not None
            images = admitted.vision is not None and admitted.vision.embeds is not None
            if self.checkpoints or self._quantization is not None or drafter or images:
                self._to_last_token(admitted)
            hit = admitted.hit
            for i, job in enumerate(jobs):
                self._insert(
                    job,
                    hit.cache if i == len(jobs) - 1 else copy.deepcopy(hit.cache),
                    hit,
                    admitted.key,
                )
            # Only now: if an insertion fails, its jobs are still found (and answered).
            self._admitted.remove(admitted)

    def _encoded(self, admitted: _Admitted) -> bool:
        """Whether a waiting prompt can be processed: a text prompt always; a vision
        prompt once its images are through the encoder, which runs on a thread of its own
        (`vision_rows.Encoder`) so that the streams beside it go on meanwhile. A failed
        encoding answers the prompt's jobs."""
        if not self._loaded.spec.vision or admitted.vision is not None:
            return True
        job = admitted.jobs[0]
        done = len(job.prompt) - len(admitted.hit.rest)
        if admitted.encoding is None:
            if job.images is None or not job.images.images_after(done):
                admitted.vision = VisionRow.prepare(self._model, job, done)  # no encoder
            else:
                assert self._encoder is not None
                admitted.encoding = self._encoder.submit(self._model, job, done)
                return False
        elif not self._encoded_everywhere(admitted.encoding):
            return False
        else:
            try:
                admitted.vision = admitted.encoding.result()
            except Exception as e:
                log.exception("encoding a prompt's images failed")
                self._admitted.remove(admitted)
                for job in admitted.jobs:
                    job.emit(ErrorEvent(internal_error(f"Encoding the images failed: {e}")))
                return False
        admitted.vision.start(self._model, admitted.hit.cache)
        return True

    def _encoded_everywhere(self, encoding: Future[VisionRow]) -> bool:
        """Whether a prompt's images are through the encoder; where ranks run in lockstep,
        on every rank: each encodes them on a thread of its own, done at its own moment,
        and every rank must take the row at the same step (its model calls hold
        collectives). Rank 0, done first, steps on and asks again each step, a moment
        apart where no stream paces its steps."""
        here = encoding.done()
        everywhere = not self._worst(float(not here))
        if here and not everywhere and not self._sequences:
            time.sleep(ENCODING_ELSEWHERE_POLL_SECONDS)
        return everywhere

    def _process_chunk(self, admitted: _Admitted, tokens: int) -> None:
        """Process the next `tokens` of a prompt too long to join the batch in one go."""
        self._advance(admitted, tokens)
        hit = admitted.hit
        total = len(admitted.jobs[0].prompt)
        done = total - len(hit.rest)
        if done // LOG_EVERY > (done - tokens) // LOG_EVERY:
            elapsed = self._clock() - admitted.arrived
            log.info("prompt processing %d/%d tokens (%.1fs)", done, total, elapsed)

    def _to_last_token(self, admitted: _Admitted) -> None:
        """Process the prompt but its last token (once for all the jobs sharing it: the
        batch takes the last). A cache that cannot be trimmed back is stored here, at the
        end of the prompt, which is where the conversation's next turn continues (the
        reply it sends back may not be the tokens generated); a quantized batch gets the
        prompt at full precision."""
        hit = admitted.hit
        self._advance(admitted, len(hit.rest) - 1)
        if self.checkpoints and hit.cached_tokens < len(admitted.processed()):
            self._checkpoint(admitted)

    def _advance(self, admitted: _Admitted, tokens: int) -> None:
        """Process the next `tokens` of a waiting prompt into its cache, keeping a
        checkpoint at each of the job's checkpoint positions passed on the way."""
        hit = admitted.hit
        job = admitted.jobs[0]
        done = len(job.prompt) - len(hit.rest)
        end = done + tokens
        marks = job.checkpoints if self.checkpoints else ()
        for stop in sorted({*(m for m in marks if done < m < end), end}):
            start, count, done = done, stop - done, stop
            if count <= 0:
                continue
            tokens_now = job.prompt[start:stop]  # tokens, not the image keys in hit.rest
            chunk = mx.array(tokens_now)[None]
            following = job.prompt[start + 1 : stop + 1]  # each position's next token
            if admitted.vision is not None:
                hidden = admitted.vision.process(
                    self._model, tokens_now, start, hit.cache, hidden=self._head is not None
                )
                if hidden is not None:
                    self._head_entries(hit, hidden, following)
            elif self._head is not None:
                self._head_prefill(hit, count, following)
            else:
                self._model(chunk, cache=hit.cache[: self._layers])
            if self._loaded.draft_model is not None:
                self._loaded.draft_model(chunk, cache=hit.cache[self._layers :])
            mx.eval([c.state for c in hit.cache])
            hit.rest = hit.rest[count:]
            if stop in marks:
                self._checkpoint(admitted)

    def _head_prefill(self, hit: CacheHit, count: int, following: list[int]) -> None:
        """Process the next `count` prompt tokens into the model's caches and the head
        drafter's (`_head_entries`)."""
        assert self._capture is not None
        self._capture(mx.array(hit.rest[:count])[None], cache=hit.cache[: self._layers])
        self._head_entries(hit, cast(mx.array, self._capture.hidden), following)

    def _head_entries(self, hit: CacheHit, hidden: mx.array, following: list[int]) -> None:
        """The head drafter's entries for prompt positions whose model's hidden states
        are `hidden`: each pairs the hidden state with the token after it (`following`;
        the rest of the prompt always holds one: the batch takes the last); a DFlash
        drafter's is the context at each position."""
        if isinstance(self._head, DFlashDrafter):
            self._head.take(hidden, hit.cache[self._layers :])
            return
        self._head(mx.array(following)[None], hidden, hit.cache[self._layers :])

    def _checkpoint(self, admitted: _Admitted) -> None:
        """Keep a copy of the cache as it is, holding the prompt processed so far."""
        checkpoint = copy.deepcopy(admitted.hit.cache)
        if self._quantization is not None:
            checkpoint = self._quantization.quantized(checkpoint)
        self._cache.store(admitted.key, admitted.processed(), checkpoint)

    def _drop_cancelled_admissions(self) -> None:
        """Forget waiting requests whose every job was cancelled; the prompt processed so
        far is kept in the prompt cache."""
        for admitted in list(self._admitted):
            if all(job.cancelled.is_set() for job in admitted.jobs):
                self._admitted.remove(admitted)
                if admitted.hit.cached_tokens < len(admitted.processed()):
                    self._cache.store(admitted.key, admitted.processed(), admitted.hit.cache)

    def _fresh(self) -> list[Any]:
        return _fresh_caches(self._model, self._loaded, self._head)

    def _insert(self, job: GenerationJob, cache: list[Any], hit: CacheHit, key: str) -> None:
        tokenizer = self._loaded.tokenizer
        params = job.params
        rest = job.prompt[len(job.prompt) - len(hit.rest) :]  # real tokens, not image keys
        if self._quantization is not None:  # the batch quantizes from here
            cache = self._quantization.quantized(cache)
        (uid,) = self._generator.insert(
            [rest],
            max_tokens=[params.max_tokens],
            caches=[cache],
            all_tokens=[job.prompt[: len(job.prompt) - len(rest)]],
            samplers=[build_sampler(params, tokenizer.all_special_ids, len(tokenizer))],
            logits_processors=[build_logits_processors(params)],
        )
        output = SequenceOutput(job, tokenizer, hit)
        self._sequences[uid] = _Sequence(job, output, key)

    def _remove(self, uids: list[int], keep_cache: bool) -> None:
        if not uids:
            return
        caches = self._generator.remove(uids, return_prompt_caches=keep_cache)
        for uid, (cache, tokens) in caches.items():
            sequence = self._sequences[uid]
            self._cache.store(sequence.key, sequence.key_tokens(tokens), cache)
        for uid in uids:
            del self._sequences[uid]

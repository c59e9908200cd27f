"""Drafting rows: which drafts a continuous batch verifies (`speculation_plan.py`'s table,
from what the model and the server have and what this device's verify passes cost), the
speculative batch that verifies them installed in mlx-lm's generator, and a drafter's
caches beside the model's (a draft model's, or a hidden-state head's: an MTP head, an
EAGLE-3 or a DFlash drafter, which read the model's hidden states of each pass).

The speculative batches themselves are `engine/speculation/`; the drafters' own models
are `mlxserve/engine/drafters/`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from mlxserve.adapters.layers import ModelAdapters
from mlxserve.compat import loaded_classes
from mlxserve.engine.continuous.adapter_rows import AdapterRowsModel
from mlxserve.engine.continuous.batch_model import batch_model
from mlxserve.engine.continuous.row_entry import RowEntry
from mlxserve.engine.continuous.row_feature import Forwarded, RowFeature
from mlxserve.engine.continuous.rows import WaitingPrompt
from mlxserve.engine.drafters.dflash import DFlashDrafter
from mlxserve.engine.drafters.hidden import HiddenCapture, splits_exactly
from mlxserve.engine.memory.footprint import KVFootprint, measure_footprint
from mlxserve.engine.memory.loader import LoadedModel
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
from mlxserve.engine.speculation.verify import SpeculationCounts, speculate_in

log = logging.getLogger(__name__)

# The caches (as a sequence makes them) whose batch caches drop a pass's rejected drafts:
# cut off, or (recurrent states, mlx-lm's and a vision model's) taken from the pass's
# records or again from where it began.
ROLLS_BACK = (KVCache, RotatingKVCache, ArraysCache)
VISION_MODEL = "mlxserve.engine.continuous.vision_model"  # its VisionArraysCache too


def can_roll_back(caches: list[Any]) -> bool:
    """Whether a sequence's caches can drop rejected drafts: attention caches are trimmed,
    sliding windows too (a pass over several tokens overwrites nothing: see
    `compat.roll_back_window`); recurrent states are taken from the pass's records
    (`recurrent_steps`) or again from where it began (`SpeculativeBatch._replay`); a vision
    row's RoPE delta and a row's adapter hold no positions."""
    rolls_back = (*ROLLS_BACK, *loaded_classes(VISION_MODEL, "VisionArraysCache"))
    return all(type(c) in rolls_back or isinstance(c, RowEntry) for c in caches)


def sequence_caches(*models: Any) -> list[Any]:
    """A sequence's empty caches: each model's in turn (the model's as the batch calls it,
    then its drafter's), those that are not None."""
    return [c for m in models if m is not None for c in make_prompt_cache(m)]


def drops_drafts(loaded: LoadedModel) -> bool:
    """Whether the model's and its draft model's caches can drop the drafts the model
    rejects (`can_roll_back`: full attention, sliding windows and recurrent layers,
    mlx-lm's and mlx-vlm's; not Llama 4's chunked attention)."""
    model = batch_model(loaded.model, loaded.spec.vision)
    return can_roll_back(sequence_caches(model, loaded.draft_model))


class DraftingFeature(RowFeature):
    def __init__(
        self,
        loaded: LoadedModel,
        model: Any,
        limits: Any,
        draft_tokens: int,
        worst: Callable[[float], float],
        lockstep: bool,
        adapters: ModelAdapters | None,
    ):
        """`model`: what the batch calls; `limits`: the batch's ContinuousBatchLimits;
        `draft_tokens`: drafted per step by the model's draft model, if it has one;
        `worst`: the largest of every rank's value (see engine.loop.loop_step), where
        ranks run the batch in `lockstep`; `adapters`: the model's, where rows take them."""
        self._loaded = loaded
        self._model = model
        self._limits = limits
        self._draft_tokens = draft_tokens
        self._worst = worst
        self._layers = len(make_prompt_cache(model))  # the model's own caches
        self._costs: dict[tuple[int, bool], DraftCosts] = {}  # see `_draft_costs`
        self._plan = self._plan_speculation(lockstep)
        # drafting from the model's hidden states
        self.head: Any = loaded.head if self._plan.head else None
        self._capture: Any = None
        if self.head is not None and loaded.spec.vision:
            from mlxserve.engine.continuous.vision_model import VisionHiddenCapture

            self._capture = VisionHiddenCapture(model)
        elif self.head is not None:
            self._capture = HiddenCapture(loaded.model, self.head.reads)
            if adapters is not None:
                self._capture = AdapterRowsModel(self._capture, adapters)
        self.key = "|head" if self.head is not None else ""
        # a drafter's state beside the caches: its rows are not parked
        self.parks = loaded.draft_model is None and self.head is None

    @property
    def called(self) -> Any:
        """What mlx-lm's generator calls: the model, or its capture of the hidden states
        a head reads."""
        return self._capture if self._capture is not None else self._model

    def _plan_speculation(self, lockstep: bool) -> SpeculationPlan:
        """What drafts this batch verifies (speculation_plan.py's table)."""
        loaded, limits, head = self._loaded, self._limits, self._loaded.head
        draft_tokens = self._draft_tokens
        if isinstance(head, DFlashDrafter):
            draft_tokens = head.block - 1  # it guesses its block less one
        features = SpeculationFeatures(
            name=loaded.spec.path.name,
            draft_model=loaded.draft_model is not None,
            head=head.name if head is not None else None,
            head_asked=head is not None and head.reads is not None,  # an EAGLE-3 drafter
            rolls_back=can_roll_back(make_prompt_cache(self._model)),
            # a vision model's capture reads the hidden states its output head reads
            head_splits=head is not None and (loaded.spec.vision or splits_exactly(loaded.model)),
            kv_quantized=bool(limits.kv_bits),
            lockstep=lockstep,
            draft_tokens=draft_tokens,
            mtp=limits.mtp,
            lookup=limits.speculation,
            max_draft=limits.max_draft,
        )
        return plan_speculation(features, self._pays)

    def install(self, generator: BatchGenerator) -> SpeculationCounts | None:
        """Start verifying the planned drafts in the decode step (a hybrid model's
        recurrent layers keeping their state at each position they verify); the drafts'
        counts, where it drafts. Where the device decides (`--speculation auto` for prompt
        lookup and a drafter named by --draft-model, `--mtp auto` for the checkpoint's
        head), each row's draft is no longer than the measured costs pay for at its
        acceptance, and none where no length pays; elsewhere (`on`, and `off` beside a
        named drafter) every row drafts as much as its acceptance says."""
        plan, draft_model, limits, head = (
            self._plan,
            self._loaded.draft_model,
            self._limits,
            self.head,
        )
        records_steps(self._loaded.model)
        auto = limits.speculation == "auto"  # lookup's and a named drafter's lengths
        if plan.draft_model and draft_model is not None:
            costs = self._costs_if(auto, self._draft_tokens + 1, chained(draft_model))
            return draft_with_model(generator, self._draft_tokens, draft_model, costs)
        if isinstance(head, DFlashDrafter):
            costs = self._costs_if(auto, head.block, head.drafting)
            return draft_in_blocks(generator, head, head.block - 1, costs)
        if head is not None:
            max_draft = limits.max_draft if plan.lookup else 0
            decides = auto if head.reads is not None else limits.mtp == "auto"
            drafting = chained(head.as_model())
            costs = self._costs_if(decides, self._draft_tokens + 1, drafting)
            return draft_with_head(generator, head, self._draft_tokens, max_draft, costs)
        if not plan.lookup:
            return None
        costs = self._costs_if(auto, limits.max_draft + 1)
        return speculate_in(generator, limits.max_draft, costs)

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

    # Hooks -------------------------------------------------------------------------------

    def caches(self) -> list[Any]:
        """The draft model's or head's caches."""
        return sequence_caches(self._loaded.draft_model, self.head)

    def footprint(self, caches: list[Any]) -> KVFootprint | None:
        """The drafter's KV bytes per sequence (`caches`: its own), if it has caches."""
        head = self.head.as_model() if self.head is not None else None
        drafters = [d for d in (self._loaded.draft_model, head) if d is not None]
        footprints = [measure_footprint(d, caches) for d in drafters]
        return sum(footprints[1:], footprints[0]) if footprints else None

    def whole_prompt(self, waiting: WaitingPrompt) -> bool:
        """The drafter's caches take the prompt here too (the batch feeds only the
        model)."""
        return self._loaded.draft_model is not None or self.head is not None

    def forward(
        self, waiting: WaitingPrompt, tokens: list[int], start: int, caches: list[Any]
    ) -> Forwarded | None:
        """A text model's pass through the capture of the hidden states a head reads."""
        if self.head is None or self._loaded.spec.vision:
            return None
        self._capture(mx.array(tokens)[None], cache=caches[: self._layers])
        return Forwarded(cast(mx.array, self._capture.hidden))

    def forwarded(
        self, tokens: list[int], following: list[int], caches: list[Any], hidden: mx.array | None
    ) -> None:
        """The head's entries for the chunk's positions (each pairs the model's hidden
        state with the token after it, `following`: the rest of the prompt always holds
        one, the batch takes the last; a DFlash drafter's is the context at each
        position), or the draft model's pass over the chunk."""
        drafter_caches = caches[self._layers :]
        if self.head is not None and hidden is not None:
            if isinstance(self.head, DFlashDrafter):
                self.head.take(hidden, drafter_caches)
            else:
                self.head(mx.array(following)[None], hidden, drafter_caches)
        if self._loaded.draft_model is not None:
            self._loaded.draft_model(mx.array(tokens)[None], cache=drafter_caches)

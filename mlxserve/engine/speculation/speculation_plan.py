"""Which drafts a batch verifies: one decision, from what the model and the server have,
by the table below.

    drafter        drafts when                          never when (the first that holds
                                                        is the reason logged)
    draft model    --draft-model names one (whatever    its caches cannot drop rejected
                   the device: asked for by name;       drafts (refused before: model_session.py)
                   under --speculation auto each row
                   drafts what the costs pay for)
    hidden-state   the checkpoint's MTP head (--mtp on, --num-draft-tokens is 0; ranks run
    head           or auto where verifying pays), or    in lockstep; a draft model drafts
                   an EAGLE-3 --draft-model (always)    instead; the KV cache is quantized;
                                                        its caches cannot drop drafts; its
                                                        logits are more than its output
                                                        head over its last hidden state
    prompt lookup  --speculation on, or auto where      --speculation off or --max-draft 0;
                   verifying pays; beside a head, for   a draft model drafts; its caches
                   the positions the head leaves        cannot drop drafts
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeculationFeatures:
    name: str  # the model's, for the log
    draft_model: bool  # a --draft-model (a small language model)
    head: str | None  # the hidden-state drafter's name ("... MTP head"), if the model has one
    head_asked: bool  # an EAGLE-3 drafter: asked for by name, it drafts whatever --mtp says
    rolls_back: bool  # the caches can drop rejected drafts
    head_splits: bool  # the logits are the output head over the last hidden state
    kv_quantized: bool
    lockstep: bool  # ranks run this batch in lockstep
    draft_tokens: int  # --num-draft-tokens
    mtp: str  # --mtp: auto, on, off
    lookup: str  # --speculation: auto, on, off
    max_draft: int  # --max-draft


@dataclass(frozen=True)
class SpeculationPlan:
    draft_model: bool = False
    head: bool = False
    lookup: bool = False  # beside a head: for the positions it does not draft


Rule = tuple[Callable[[SpeculationFeatures], bool], str]
# What rules a hidden-state head out, in order.
HEAD_OFF: tuple[Rule, ...] = (
    (lambda f: f.draft_tokens <= 0, "--num-draft-tokens is 0"),
    (lambda f: f.lockstep, "ranks run in lockstep"),
    (lambda f: f.draft_model, "a draft model drafts instead"),
    (lambda f: f.kv_quantized, "the KV cache is quantized"),
    (lambda f: not f.rolls_back, "its caches cannot drop rejected drafts"),
    (
        lambda f: not f.head_splits,
        "its logits are more than its output head over its last hidden state",
    ),
)


def plan_speculation(f: SpeculationFeatures, pays: Callable[[int, bool], bool]) -> SpeculationPlan:
    """The drafts to verify, decided before the batch is built (the head's caches and the
    model's capture depend on it). `pays(width, with_head)`: whether verifying `width`
    tokens (drafted by the head, if `with_head`) costs this device at most half the steps
    it can save (a measurement: asked only where a mode is auto)."""
    head = _head_drafts(f, pays)
    if not f.rolls_back:
        if f.lookup != "off":
            log.info("Speculation off for %s: its caches cannot drop rejected drafts", f.name)
        return SpeculationPlan()
    if f.draft_model:  # asked for by name: its drafts, whatever the device
        return SpeculationPlan(draft_model=True)
    return SpeculationPlan(head=head, lookup=_lookup_drafts(f, pays))


def _head_drafts(f: SpeculationFeatures, pays: Callable[[int, bool], bool]) -> bool:
    mode = "on" if f.head_asked else f.mtp
    if f.head is None or mode == "off":
        return False
    why = next((reason for holds, reason in HEAD_OFF if holds(f)), None)
    if why is None and mode == "auto" and not pays(f.draft_tokens + 1, True):
        why = "drafting cannot pay on this device"
    if why is not None:
        log.info("Drafting with its %s off for %s: %s", f.head, f.name, why)
        return False
    log.info("Drafting with its %s for %s: %d tokens per step", f.head, f.name, f.draft_tokens)
    return True


def _lookup_drafts(f: SpeculationFeatures, pays: Callable[[int, bool], bool]) -> bool:
    if f.lookup == "off" or f.max_draft <= 0:
        return False
    if f.lookup == "auto" and not pays(f.max_draft + 1, False):
        log.info("Prompt-lookup speculation off for %s: it cannot pay", f.name)
        return False
    return True

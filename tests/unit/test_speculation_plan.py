"""The speculation table (engine/speculation/speculation_plan.py): what combines with what, and the
reason logged when a drafter is ruled out."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from mlxserve.engine.speculation.speculation_plan import (
    SpeculationFeatures,
    SpeculationPlan,
    plan_speculation,
)

PLAIN = SpeculationFeatures(
    name="m",
    draft_model=False,
    head=None,
    head_asked=False,
    rolls_back=True,
    head_splits=True,
    kv_quantized=False,
    lockstep=False,
    draft_tokens=3,
    mtp="auto",
    lookup="auto",
    max_draft=8,
)
MTP = replace(PLAIN, head="Qwen3.5-layout MTP head")


def always(width: int, with_head: bool) -> bool:
    return True


def never(width: int, with_head: bool) -> bool:
    return False


def test_prompt_lookup_where_it_pays_and_where_asked():
    assert plan_speculation(PLAIN, always) == SpeculationPlan(lookup=True)
    assert plan_speculation(PLAIN, never) == SpeculationPlan()
    assert plan_speculation(replace(PLAIN, lookup="on"), never) == SpeculationPlan(lookup=True)
    assert plan_speculation(replace(PLAIN, max_draft=0), always) == SpeculationPlan()


def test_a_draft_model_drafts_whatever_the_device():
    features = replace(MTP, draft_model=True)
    assert plan_speculation(features, never) == SpeculationPlan(draft_model=True)


def test_a_head_drafts_beside_lookup_where_each_pays():
    asked: list[tuple[int, bool]] = []

    def head_only(width: int, with_head: bool) -> bool:
        asked.append((width, with_head))
        return with_head

    assert plan_speculation(MTP, head_only) == SpeculationPlan(head=True)
    assert asked == [(4, True), (9, False)]  # --num-draft-tokens + 1, --max-draft + 1
    assert plan_speculation(MTP, always) == SpeculationPlan(head=True, lookup=True)


def test_an_eagle3_drafter_drafts_even_with_mtp_off():
    eagle = replace(MTP, head="EAGLE-3 drafter", head_asked=True, mtp="off")
    assert plan_speculation(eagle, never).head


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"draft_tokens": 0}, "--num-draft-tokens is 0"),
        ({"lockstep": True}, "ranks run in lockstep"),
        ({"kv_quantized": True}, "the KV cache is quantized"),
        ({"head_splits": False}, "its logits are more than its output head"),
        ({"rolls_back": False}, "its caches cannot drop rejected drafts"),
        ({}, "drafting cannot pay on this device"),
    ],
)
def test_what_rules_a_head_out_is_logged(change, reason, caplog):
    with caplog.at_level(logging.INFO, logger="mlxserve.engine.speculation.speculation_plan"):
        plan = plan_speculation(replace(MTP, **change), never)
    assert not plan.head
    assert f"Drafting with its Qwen3.5-layout MTP head off for m: {reason}" in caplog.text


def test_caches_that_cannot_roll_back_draft_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="mlxserve.engine.speculation.speculation_plan"):
        plan = plan_speculation(replace(MTP, rolls_back=False, lookup="on"), always)
    assert plan == SpeculationPlan()
    assert "Speculation off for m: its caches cannot drop rejected drafts" in caplog.text

"""Replies with and without speculation, and the drafts counted in /metrics."""

from __future__ import annotations

import pytest

from helpers.metrics import metrics
from helpers.server import CHAT

# A drafter named by --draft-model drafts for every row each step: under the default
# (`auto`) this CPU's measured costs would stop it (see engine/speculation/draft_costs.py), and what
# these tests check is what drafting does.
DRAFT_ALWAYS = ("--speculation", "on")


def reply(srv, body: dict) -> tuple[dict, list[tuple]]:
    """The choice (logprobs taken out) and its logprob entries as tuples."""
    status, _, answer = srv.post(CHAT, {**body, "logprobs": True, "top_logprobs": 3})
    assert status == 200, answer
    choice = answer["choices"][0]
    entries = [
        (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
        for e in choice.pop("logprobs")["content"]
    ]
    for call in choice["message"].get("tool_calls") or []:
        del call["id"]
    return {**choice, "usage": answer["usage"]}, entries


def tokens(answer: tuple) -> list[str]:
    """A `reply`'s tokens."""
    return [e[0] for e in answer[1]]


def assert_same(plain: tuple, speculated: tuple) -> None:
    """The same message, finish reason, usage and tokens; logprobs equal to float32
    rounding (a pass over several positions adds up in another order)."""
    assert speculated[0] == plain[0]
    assert tokens(speculated) == tokens(plain)
    for (_, lp, top), (_, lp0, top0) in zip(speculated[1], plain[1], strict=True):
        assert lp == pytest.approx(lp0, abs=1e-4)
        assert [t for t, _ in top] == [t for t, _ in top0]
        assert [v for _, v in top] == pytest.approx([v for _, v in top0], abs=1e-4)


def speculated(srv, outcome: str) -> float:
    """The server's drafted or accepted tokens, every model's."""
    return _total(srv, f"_{outcome}_tokens_total")


def accepted(srv) -> float:
    return speculated(srv, "accepted")


def drafting_counts(srv, body: dict) -> tuple[tuple[float, float], tuple]:
    """The tokens drafted and accepted for one request (sent alone), and its reply."""
    before = (speculated(srv, "drafted"), accepted(srv))
    answer = reply(srv, body)
    return (speculated(srv, "drafted") - before[0], accepted(srv) - before[1]), answer


def verified(srv) -> float:
    """The drafts the server verified (a sequence's draft in one pass), every model's."""
    return _total(srv, "_verified_drafts_total")


def replayed(srv) -> float:
    """The verify passes the server ran again for recurrent layers, every model's."""
    return _total(srv, "_replayed_passes_total")


def _total(srv, suffix: str) -> float:
    return sum(v for (name, _), v in metrics(srv).items() if name.endswith(suffix))

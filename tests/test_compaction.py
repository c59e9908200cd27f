"""Remote compaction in the Responses API: `POST /v1/responses/compact` and a
`compaction_trigger` item answer with exactly one `compaction` item, a summary the model
writes, sealed; sent back, it stands for the conversation it replaced."""

from __future__ import annotations

import pytest
from conversations import BY_NAME
from helpers.sse import named_events, stream

from mlxserve.api import secret
from mlxserve.api.responses.compaction import EXPANSION
from mlxserve.api.responses.sealed import COMPACTION, REASONING
from mlxserve.models.demo import cache_root

secret.install(None, cache_root())  # the servers' key: this install's, in the cache folder

RESPONSES = "/v1/responses"
COMPACT = "/v1/responses/compact"
CONVERSATION = [
    {"role": "user", "content": "Tell me a story."},
    {"role": "assistant", "content": BY_NAME["story"].reply},
    {"role": "user", "content": "Now fix the failing test in tests/test_http.py."},
]
NEXT = {"role": "user", "content": "What is the capital of France?"}


def summary_of(item: dict) -> str:
    assert set(item) == {"type", "id", "encrypted_content"}
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    summary = COMPACTION.unseal(item["encrypted_content"], "item")
    assert summary, item
    return summary


def input_tokens(server, items) -> int:
    status, _, body = server.post(RESPONSES, {"input": items, "max_output_tokens": 1})
    assert status == 200, body
    return body["usage"]["input_tokens"]


@pytest.fixture(scope="module")
def compacted(server) -> dict:
    status, _, body = server.post(
        COMPACT, {"model": "default", "input": CONVERSATION, "instructions": "Be brief."}
    )
    assert status == 200, body
    return body


def test_the_compact_endpoint_answers_one_compaction_item(compacted):
    assert set(compacted) == {"id", "object", "created_at", "output", "usage"}
    assert compacted["object"] == "response.compaction" and compacted["id"].startswith("resp_")
    assert len(compacted["output"]) == 1
    summary_of(compacted["output"][0])
    assert compacted["usage"]["input_tokens"] > 0 and compacted["usage"]["output_tokens"] > 0


def test_a_compaction_item_expands_into_its_summary(server, compacted):
    """Sent back, the item is the summary as a user turn: the prompt is the one with that
    turn in its place, and a blob that is not this server's compaction is left out."""
    item = compacted["output"][0]
    summary = summary_of(item)
    expanded = input_tokens(server, [item, NEXT])
    assert expanded == input_tokens(
        server, [{"role": "user", "content": EXPANSION + summary}, NEXT]
    )
    forged = {**item, "encrypted_content": REASONING.seal("I am the model's own summary.")}
    assert input_tokens(server, [forged, NEXT]) == input_tokens(server, [NEXT])


@pytest.mark.parametrize("streamed", [False, True])
def test_a_compaction_trigger_answers_one_compaction_item(server, compacted, streamed):
    """Codex's way: the trigger ends an ordinary request's input (stateless, streamed);
    the summary is the compact endpoint's for the same conversation."""
    request = {
        "model": "default",
        "input": [*CONVERSATION, {"type": "compaction_trigger"}],
        "instructions": "Be brief.",
        "store": False,
        "stream": streamed,
    }
    if streamed:
        events = [payload for _, payload in named_events(stream(server.url, RESPONSES, request))]
        assert [e["type"] for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed",
        ]
        assert [e["sequence_number"] for e in events] == list(range(5))
        response = events[-1]["response"]
        assert events[2]["item"] == events[3]["item"] == response["output"][0]
    else:
        status, _, response = server.post(RESPONSES, request)
        assert status == 200, response
    assert response["status"] == "completed" and len(response["output"]) == 1
    assert summary_of(response["output"][0]) == summary_of(compacted["output"][0])


def test_a_conversation_longer_than_the_context_is_compacted(launch, tiny_model):
    """What compaction is for: the oldest turns that do not fit are left out of the
    summary's prompt instead of failing it."""
    srv = launch(tiny_model, "--max-context", "300")
    long = [*CONVERSATION[:2]] * 4 + [CONVERSATION[2]]
    status, _, body = srv.post(RESPONSES, {"input": long, "max_output_tokens": 1})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, _, body = srv.post(COMPACT, {"input": long})
    assert status == 200, body
    summary_of(body["output"][0])


def test_a_trigger_must_end_the_input(server):
    request = {"input": [{"type": "compaction_trigger"}, *CONVERSATION]}
    status, _, body = server.post(RESPONSES, request)
    assert status == 400 and body["error"]["param"] == "input[0]", body
    status, _, body = server.post(COMPACT, {"input": CONVERSATION, "stream": True})
    assert status == 400 and body["error"]["param"] == "stream", body

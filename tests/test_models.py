"""The model catalog and the resident set end to end: listing, loading by name, allowed
folders, failed loads, the HF cache; and the model list in Anthropic's shape, through the
`anthropic` SDK."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from urllib.parse import quote

import anthropic
import pytest
from conversations import BY_NAME

CHAT = "/v1/chat/completions"
MESSAGES = BY_NAME["capital"].messages
REPLY = BY_NAME["capital"].reply


@pytest.fixture
def model_dir(tmp_path, tiny_model):
    root = tmp_path / "models"
    shutil.copytree(tiny_model, root / "tiny-copy")
    broken = root / "broken"  # a valid tokenizer, so the failure comes from loading weights
    shutil.copytree(tiny_model, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    (broken / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    (broken / "model.safetensors").write_bytes(b"not weights")
    return root


@pytest.fixture
def hub_cache(tmp_path, tiny_model):
    """A Hugging Face cache holding the tiny model as 'tiny-org/tiny-chat'."""
    repo = tmp_path / "hub" / "models--tiny-org--tiny-chat"
    shutil.copytree(tiny_model, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return tmp_path / "hub"


def loads(server) -> list[str]:
    return [line for line in server.log if "Loading model from" in line]


def ask(server, model=None):
    body = {"messages": MESSAGES, **({"model": model} if model else {})}
    return server.post(CHAT, body)


def states(server) -> dict[str, str]:
    return {m["id"]: m["state"] for m in server.get("/v1/models")[2]["data"]}


def test_listing_and_loading_by_name(launch, tiny_model, model_dir, hub_cache):
    """Models named by a request load beside the served one and stay resident."""
    srv = launch(tiny_model, "--model-dir", str(model_dir), env={"HF_HUB_CACHE": str(hub_cache)})
    assert states(srv) == {
        str(tiny_model): "loaded",
        "broken": "not-loaded",
        "tiny-copy": "not-loaded",
        "tiny-org/tiny-chat": "not-loaded",
    }
    for model in ("tiny-copy", "tiny-org/tiny-chat", None, "tiny-copy"):
        status, _, body = ask(srv, model)
        assert status == 200 and body["choices"][0]["message"]["content"] == REPLY
        assert body["model"] == (model or str(tiny_model))
    assert len(loads(srv)) == 3  # each once: they stay resident
    assert "tiny-copy" in loads(srv)[1]
    assert states(srv)["tiny-copy"] == states(srv)["tiny-org/tiny-chat"] == "loaded"


def test_failed_load_keeps_the_previous_model(launch, tiny_model, model_dir):
    srv = launch(tiny_model, "--model-dir", str(model_dir))
    status, _, body = ask(srv, "broken")
    assert status == 400
    assert body["error"]["code"] == "model_load_failed" and body["error"]["param"] == "model"
    status, _, body = ask(srv)
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY
    attempts = loads(srv)
    assert len(attempts) == 2 and "broken" in attempts[1]  # the served model stayed loaded
    # Streamed, the failure comes before any output: a plain JSON error, not a broken stream.
    status, headers, body = srv.post(
        CHAT, {"messages": MESSAGES, "model": "broken", "stream": True}
    )
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert body["error"]["code"] == "model_load_failed"
    assert srv.get("/health")[0] == 200


def test_paths_outside_allowed_folders_are_refused(launch, tiny_model, model_dir, tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(tiny_model, outside)
    srv = launch(tiny_model, "--model-dir", str(model_dir))
    for model in (str(outside), str(model_dir / ".." / "outside"), "../outside", "/etc"):
        status, _, body = ask(srv, model)
        assert status == 404 and body["error"]["code"] == "model_not_found", model
    assert len(loads(srv)) == 1
    status, _, body = ask(srv, str(model_dir / "tiny-copy"))
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY


def test_models_without_any_hf_cache(launch, tiny_model, tmp_path):
    srv = launch(tiny_model, env={"HF_HUB_CACHE": str(tmp_path / "does-not-exist")})
    status, _, body = srv.get("/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [str(tiny_model)]


# Anthropic's Models API: the same list, in its shape, for a request with anthropic-version

ANTHROPIC = {"anthropic-version": "2023-06-01"}
MODEL_INFO = {"type", "id", "display_name", "created_at", "lifecycle"}
MODEL_INFO |= {"max_input_tokens", "max_tokens"}
OPENAI_ONLY = {"object", "created", "owned_by", "kind", "context_length", "state"}
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def test_the_anthropic_sdk_lists_pages_and_retrieves_models(
    launch, tiny_model, model_dir, hub_cache, embed_bert_model
):
    """client.models.list() shows the models the Messages API serves, in the OpenAI list's
    order, paged by its cursors; retrieve() takes every name a request may use (the
    served alias, --model-alias names); an unknown model, or one Messages does not serve,
    is its NotFoundError. The key is Anthropic's x-api-key."""
    srv = launch(
        tiny_model,
        *("--model", str(embed_bert_model), "--model-dir", str(model_dir)),
        *("--model-alias", "claude-*=default", "--api-key", "secret"),
        env={"HF_HUB_CACHE": str(hub_cache)},
    )
    listed = srv.get("/v1/models", {"Authorization": "Bearer secret"})[2]["data"]
    chat = [m["id"] for m in listed if m["kind"] == "chat"]
    assert len(chat) == 4 and str(embed_bert_model) in [m["id"] for m in listed]
    client = anthropic.Anthropic(base_url=srv.url, api_key="secret", max_retries=0)

    page = client.models.list()
    assert [m.id for m in page.data] == chat and page.has_more is False
    assert (page.first_id, page.last_id) == (chat[0], chat[-1])
    served = page.data[0]
    assert served.type == "model" and served.display_name == str(tiny_model)
    assert served.created_at == EPOCH and served.lifecycle == "active"
    assert served.max_input_tokens == served.max_tokens == 4096

    first = client.models.list(limit=1)
    assert [m.id for m in first.data] == chat[:1] and first.has_more is True
    assert [m.id for m in first] == chat  # the SDK pages on with after_id to the end
    assert [m.id for m in client.models.list(limit=3, after_id=chat[0])] == chat[1:]
    before = client.models.list(limit=2, before_id=chat[-1])
    assert [m.id for m in before.data] == chat[1:3] and before.has_more is True
    assert client.models.list(lifecycle=["retired"]).data == []
    assert [m.id for m in client.models.list(lifecycle=["active"]).data] == chat

    for name in ("default", "claude-sonnet-4-5", "tiny-copy", "tiny-org/tiny-chat"):
        model = client.models.retrieve(name)
        assert model.id == name and model.type == "model" and model.max_input_tokens == 4096
    for name, why in (("gpt-4o", "does not exist"), (str(embed_bert_model), "(embedding)")):
        with pytest.raises(anthropic.NotFoundError) as caught:
            client.models.retrieve(name)
        error = caught.value.body["error"]
        assert error["type"] == "not_found_error" and why in error["message"], error
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).models.list()
    assert refused.value.body["type"] == "error"


def test_the_anthropic_shapes_exactly(server, tiny_model):
    """Raw HTTP: Anthropic's fields and none of OpenAI's with anthropic-version, OpenAI's
    shape without it; the paging parameters checked, each error in Anthropic's shape."""
    status, _, body = server.get("/v1/models", ANTHROPIC)
    assert status == 200 and set(body) == {"data", "has_more", "first_id", "last_id"}
    (model,) = body["data"]
    assert set(model) == MODEL_INFO and not OPENAI_ONLY & (set(model) | set(body))
    assert model["created_at"] == "1970-01-01T00:00:00Z" and model["id"] == str(tiny_model)
    assert body["first_id"] == body["last_id"] == str(tiny_model) and body["has_more"] is False
    status, _, one = server.get(f"/v1/models/{quote(str(tiny_model), safe='')}", ANTHROPIC)
    assert status == 200 and one == model
    status, _, alias = server.get("/models/default", ANTHROPIC)  # without /v1 too
    assert status == 200 and alias == {**model, "id": "default", "display_name": "default"}

    status, _, openai = server.get("/v1/models")  # no anthropic-version: OpenAI's shape
    assert status == 200 and openai["object"] == "list" and "has_more" not in openai
    assert openai["data"][0]["owned_by"] == "mlxserve"

    empty = server.get("/v1/models?lifecycle[]=deprecated", ANTHROPIC)[2]
    assert empty == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    for query, param in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("after_id=nobody", "after_id"),
        ("before_id=nobody", "before_id"),
        (f"after_id={quote(str(tiny_model))}&before_id=x", "before_id"),
        ("lifecycle[]=gone", "lifecycle"),
    ]:
        status, _, body = server.get(f"/v1/models?{query}", ANTHROPIC)
        assert status == 400 and body["type"] == "error", query
        error = body["error"]
        assert set(error) == {"type", "message"} and error["type"] == "invalid_request_error"
        assert param in error["message"], (query, error)
    status, _, missing = server.get("/v1/models/gpt-4o", ANTHROPIC)
    assert status == 404 and missing == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model 'gpt-4o' does not exist."},
    }
    status, _, missing = server.get("/v1/models/gpt-4o")
    assert status == 404 and missing["error"]["code"] == "model_not_found"

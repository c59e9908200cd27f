"""ModelProvider end to end: listing, loading by name, allowed folders, failed loads, the HF
cache."""

from __future__ import annotations

import json
import shutil

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

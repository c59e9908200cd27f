"""Several models resident at once: every --model loaded at start, requests for different
models running at the same time, the memory budget unloading idle models least recently
used first, idle unload, pinning, and the operators' load/unload endpoints."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from conversations import BY_NAME, COLOUR_QUESTION, data_uri, square_png
from helpers.server import start_server
from helpers.sse import Stream, chat_text, open_stream
from helpers.streams import endless

CHAT = "/v1/chat/completions"
CAPITAL = BY_NAME["capital"]


@pytest.fixture
def model_dir(tmp_path, tiny_model):
    root = tmp_path / "models"
    shutil.copytree(tiny_model, root / "tiny-copy")
    return root


def weights_gb(model) -> float:
    return sum(f.stat().st_size for f in model.glob("*.safetensors")) / 1e9


def ask(srv, model: str | None = None, conv=CAPITAL, **extra):
    body = {**conv.request, **({"model": model} if model else {}), **extra}
    return srv.post(CHAT, body)


def reply(response) -> str:
    status, _, body = response
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def states(srv) -> dict[str, str]:
    return {m["id"]: m["state"] for m in srv.get("/v1/models")[2]["data"]}


def events(srv, word: str) -> list[str]:
    return [line for line in srv.log if word in line]


def test_two_models_stream_at_once(launch, tiny_model, metaspace_model):
    """While a long stream runs on one model, the other answers; each reply is token for
    token what it is alone, and neither model is reloaded."""
    srv = launch(str(tiny_model), "--model", str(metaspace_model))
    assert states(srv) == {str(tiny_model): "loaded", str(metaspace_model): "loaded"}
    long_request = {**endless(tiny_model, max_tokens=1500), "model": str(tiny_model)}
    alone_long = reply(srv.post(CHAT, long_request))
    alone_short = reply(ask(srv, str(metaspace_model)))
    conn, response = open_stream(srv.url, CHAT, {**long_request, "stream": True})
    lines = [response.readline()]  # the long stream is decoding
    assert reply(ask(srv, str(metaspace_model))) == alone_short == CAPITAL.reply
    rest = response.read().decode().splitlines()
    conn.close()
    chunks = Stream(200, {}, [line.decode() for line in lines] + rest).chunks
    after = [line for line in rest if line.startswith("data: {")]
    assert len(after) > 10  # the long stream went on after the short answer
    assert chat_text(chunks) == alone_long
    assert len(events(srv, "Loading model from")) == 2


def test_a_vision_and_a_text_model_together(launch, tiny_model, vision_model):
    srv = launch(str(tiny_model), "--model", str(vision_model))
    question = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_uri(square_png("green"))}},
                {"type": "text", "text": COLOUR_QUESTION},
            ],
        }
    ]
    for _ in range(2):
        assert reply(ask(srv)) == CAPITAL.reply
        status, _, body = srv.post(CHAT, {"model": str(vision_model), "messages": question})
        assert status == 200, (body, srv.log[-20:])
        assert body["choices"][0]["message"]["content"] == "Green."
    assert len(events(srv, "Loading model from")) == 2


def test_the_budget_unloads_the_least_recently_used_idle_model(launch, tiny_model, model_dir):
    """A budget with room for one model's weights: asking for the other unloads the idle
    one, and asking back swaps again; each answer is exact."""
    budget = f"{weights_gb(tiny_model) * 1.6:.6f}"
    srv = launch(tiny_model, "--model-dir", str(model_dir), "--memory-budget-gb", budget)
    assert reply(ask(srv, "tiny-copy")) == CAPITAL.reply
    assert states(srv)["tiny-copy"] == "loaded" and states(srv)[str(tiny_model)] == "not-loaded"
    assert reply(ask(srv)) == CAPITAL.reply
    assert states(srv)["tiny-copy"] == "not-loaded"
    assert len(events(srv, "Unloaded")) == 2


def test_a_model_that_cannot_fit_is_a_503_naming_the_resident_ones(launch, tiny_model, model_dir):
    """The only other model is pinned (or busy): the load is refused, nothing aborts."""
    budget = f"{weights_gb(tiny_model) * 1.6:.6f}"
    srv = launch(tiny_model, "--model-dir", str(model_dir), "--memory-budget-gb", budget, "--pin")
    status, headers, body = ask(srv, "tiny-copy")
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"]["code"] == "insufficient_memory"
    assert f"{tiny_model} (" in body["error"]["message"] and "pinned" in body["error"]["message"]
    assert reply(ask(srv)) == CAPITAL.reply

    unpinned = launch(tiny_model, "--model-dir", str(model_dir), "--memory-budget-gb", budget)
    conn, response = open_stream(
        unpinned.url, CHAT, {**endless(tiny_model, max_tokens=600), "stream": True}
    )
    assert response.status == 200
    response.readline()  # the served model is busy: it cannot be unloaded
    status, _, body = ask(unpinned, "tiny-copy")
    conn.close()
    assert status == 503 and "busy" in body["error"]["message"], "\n".join(unpinned.log[-12:])


def test_idle_models_are_unloaded_and_reloaded(launch, tiny_model, model_dir):
    srv = launch(tiny_model, "--model-dir", str(model_dir), "--idle-unload-seconds", "1", "--pin")
    assert reply(ask(srv, "tiny-copy")) == CAPITAL.reply
    deadline = time.monotonic() + 15
    while states(srv)["tiny-copy"] == "loaded" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert states(srv) == {str(tiny_model): "loaded", "tiny-copy": "not-loaded"}  # pinned
    assert any("idle for 1s" in line for line in srv.log)
    assert reply(ask(srv, "tiny-copy")) == CAPITAL.reply
    assert len(events(srv, "Loading model from")) == 3


def test_a_link_out_of_the_model_dir_is_not_a_model_of_it(launch, tiny_model, model_dir):
    """A symlink in --model-dir to a folder elsewhere is neither listed nor loadable."""
    outside = model_dir.parent / "elsewhere"
    shutil.copytree(tiny_model, outside / "secret-model")
    (model_dir / "linked").symlink_to(outside / "secret-model")
    srv = launch(tiny_model, "--model-dir", str(model_dir))
    listed = [m["id"] for m in srv.get("/v1/models")[2]["data"]]
    assert "tiny-copy" in listed and "linked" not in listed, listed
    status, _, body = ask(srv, "linked")
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_load_and_unload_endpoints(launch, tiny_model, model_dir):
    srv = launch(tiny_model, "--model-dir", str(model_dir), "--api-key", "sekret")
    key = {"Authorization": "Bearer sekret"}
    status, _, _ = srv.post("/v1/models/load", {"model": "tiny-copy"})
    assert status == 401
    status, _, body = srv.post("/v1/models/load", {"model": "tiny-copy"}, key)
    assert status == 200 and body == {
        "id": "tiny-copy",
        "object": "model",
        "state": "loaded",
        "pinned": False,
    }
    listed = {m["id"]: m for m in srv.get("/v1/models", key)[2]["data"]}
    assert listed["tiny-copy"]["capabilities"] == {"tools": True, "reasoning": True}
    status, _, body = srv.post("/v1/models/pin", {"model": "tiny-copy"}, key)
    assert status == 200 and body["pinned"] is True
    assert srv.get("/v1/models/tiny-copy", key)[2]["pinned"] is True
    status, _, body = srv.post("/v1/models/pin", {"model": "tiny-copy", "pinned": False}, key)
    assert status == 200 and body["pinned"] is False
    status, _, body = srv.post("/v1/models/unload", {"model": "tiny-copy"}, key)
    assert status == 200 and body["state"] == "not-loaded"
    status, _, body = srv.post("/v1/models/load", {"model": "nope"}, key)
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, _, body = srv.post("/v1/models/unload", {}, key)
    assert status == 400 and body["error"]["param"] == "model"
    done = threading.Event()

    def stream() -> None:
        conn, response = open_stream(
            srv.url, CHAT, {**endless(tiny_model, max_tokens=2000), "stream": True}, key
        )
        response.readline()
        done.wait(30)
        conn.close()

    streaming = threading.Thread(target=stream)
    streaming.start()
    time.sleep(1)
    status, _, body = srv.post("/v1/models/unload", {"model": "default"}, key)
    done.set()
    streaming.join()
    assert status == 409 and body["error"]["code"] == "model_busy"


def test_a_config_file_names_models_and_their_settings(
    launch, tiny_model, metaspace_model, tmp_path
):
    """A --config model with its own name, aliases, template arguments, context limit and
    pinning, served beside the --model one."""
    config = tmp_path / "models.toml"
    config.write_text(
        f"""
[[models]]
model = "{metaspace_model}"
name = "other"
aliases = ["gpt-*"]
chat_template_args = {{ enable_thinking = false }}
max_context = 60
pin = true
"""
    )
    srv = launch(tiny_model, "--config", str(config), "--idle-unload-seconds", "1")
    think = BY_NAME["think"]

    def prompt_tokens(model: str, **extra) -> int:
        status, _, body = ask(srv, model, think, max_tokens=1, **extra)
        assert status == 200, body
        return body["usage"]["prompt_tokens"]

    off = {"chat_template_kwargs": {"enable_thinking": False}}
    on = {"chat_template_kwargs": {"enable_thinking": True}}
    assert prompt_tokens("other") == prompt_tokens("other", **off) != prompt_tokens("other", **on)
    assert prompt_tokens(str(tiny_model)) == prompt_tokens(str(tiny_model), **on)
    status, _, body = ask(srv, "gpt-4o")
    assert status == 200 and body["model"] == "gpt-4o"
    assert any("model=other" in line for line in events(srv, '"POST /v1/chat'))
    never_ending = {**endless(metaspace_model), "model": "other", "max_tokens": 100}
    status, _, body = srv.post(CHAT, never_ending)  # a ceiling: the context of 60 ends it
    assert status == 200 and body["choices"][0]["finish_reason"] == "length", body
    assert body["usage"]["total_tokens"] == 60
    deadline = time.monotonic() + 15
    while states(srv)[str(tiny_model)] == "loaded" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert states(srv) == {str(tiny_model): "not-loaded", "other": "loaded"}  # pinned


def test_a_config_file_mistake_stops_the_server(tiny_model, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nmodel = "x"\ncontext = 5\n')
    with pytest.raises(RuntimeError) as error:
        start_server(tiny_model, "--config", str(config))
    assert "models[0]: unknown setting context" in str(error.value)


def test_a_stream_goes_on_while_another_model_loads(tiny_model, model_dir, monkeypatch):
    """A model's weights load on their own thread: a stream of the resident model keeps
    streaming while they load (held until the stream has shown it), and the request that
    asked for the model is answered once it is in."""
    from helpers.inprocess import in_process

    from mlxserve.engine.memory.loader import ModelLoader

    read, loading, release = ModelLoader.read, threading.Event(), threading.Event()

    def held_read(self, spec):
        if spec.path.name == "tiny-copy":
            loading.set()
            release.wait(60)
        return read(self, spec)

    monkeypatch.setattr(ModelLoader, "read", held_read)
    with in_process(tiny_model, monkeypatch, model_dirs=(model_dir,)) as client:
        conn, response = open_stream(
            client.url, CHAT, {**endless(tiny_model, max_tokens=3000), "stream": True}
        )
        assert response.status == 200
        response.readline()
        asked = threading.Thread(target=lambda: answers.append(ask(client, "tiny-copy")))
        answers: list = []
        asked.start()
        assert loading.wait(30)
        conn.sock.settimeout(30)  # a frozen loop would hold the stream until the release
        chunks = [line for line in (response.readline() for _ in range(40)) if line.strip()]
        assert len(chunks) >= 10 and all(line.startswith(b"data: {") for line in chunks)
        release.set()
        asked.join(60)
        conn.close()
        assert reply(answers[0]) == CAPITAL.reply

"""Ollama's API end to end, through Ollama's own Python client (`ollama`, as it ships) and
LangChain's ChatOllama, against the trained fixtures: the model list, show and ps, chat
and generate streamed and whole, tools, images, thinking, JSON schemas, embeddings,
keep_alive, copy, create and delete, pull from a hub on loopback, the batch shared by
concurrent streams, and Ollama's errors."""

from __future__ import annotations

import base64
import json
import urllib.request
from datetime import datetime, timedelta, timezone

import jsonschema
import numpy as np
import ollama
import pytest
from adapter_fixture import QUESTIONS, REPLIES
from conversations import BY_NAME, GEMMA_BY_NAME, WEATHER_TOOL, square_png
from fake_hub import FakeHub, Repo
from helpers.server import start_server
from helpers.streams import concurrently
from helpers.structured import PERSON

CHAT = "/api/chat"


@pytest.fixture(scope="module")
def models(tiny_model, gemma_model, vision_model, embed_bert_model, qwen_coder_model) -> dict:
    """Each fixture's name as /api/tags lists it."""
    paths = {
        "chat": tiny_model,
        "gemma": gemma_model,
        "vision": vision_model,
        "embed": embed_bert_model,
        "coder": qwen_coder_model,
    }
    return {role: f"{path}:latest" for role, path in paths.items()}


@pytest.fixture(scope="module")
def hub(tiny_model):
    served = FakeHub({"test-org/tiny-chat": Repo(tiny_model)})
    yield served
    served.stop()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, models, adapters, hub):
    """One server of five models (chat, Gemma-style, vision, embedding, FIM), a LoRA
    adapter, a names store and a Hugging Face cache of its own, and the hub on loopback."""
    root = tmp_path_factory.mktemp("ollama")
    paths = [m.removesuffix(":latest") for m in models.values()]
    args = [arg for path in paths[1:] for arg in ("--model", path)]
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "0"}
    env |= {"HF_HUB_DISABLE_XET": "1"}
    server = start_server(
        paths[0],
        *args,
        *("--lora", f"pirate={adapters / 'pirate'}"),
        *("--model-names-db", str(root / "names.sqlite")),
        env=env,
    )
    server.names_db = root / "names.sqlite"
    server.env = env
    yield server
    server.stop()


def client(server) -> ollama.Client:
    return ollama.Client(host=server.url)


def raw(server, path: str, body, method: str = "POST") -> tuple[int, str, bytes]:
    """A request as bytes (status, content type, body), whatever the status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def lines(body: bytes) -> list[dict]:
    """An NDJSON body's objects: one a line, never a blank line."""
    text = body.decode()
    assert text.endswith("\n") and "\n\n" not in text
    return [json.loads(line) for line in text.splitlines()]


def ask(server, model: str, conv, **extra) -> ollama.ChatResponse:
    return client(server).chat(model=model, messages=conv.messages, **extra)


# The catalog ------------------------------------------------------------------------------


def test_version_and_head(srv):
    status, kind, body = raw(srv, "/api/version", None, "GET")
    assert status == 200 and kind == "application/json"
    assert tuple(map(int, json.loads(body)["version"].split("."))) >= (0, 9, 0)
    for path in ("/", "/api/version", "/api/tags"):
        status, _, body = raw(srv, path, None, "HEAD")
        assert status == 200 and body == b""
    assert raw(srv, "/api/ps", None, "HEAD")[0] == 405


def test_tags_list_every_model_with_details(srv, models):
    listed = {m.model: m for m in client(srv).list().models}
    assert set(models.values()) <= set(listed)
    chat = listed[models["chat"]]
    assert chat.details.format == "mlx" and chat.details.family == "qwen3"
    assert chat.details.families == ["qwen3"] and chat.details.quantization_level == "F32"
    assert chat.details.parameter_size.endswith("K") and chat.size > 0
    assert len(chat.digest) == 64 and int(chat.digest, 16) >= 0
    digests = {m.digest for m in listed.values()}
    assert len(digests) == len(listed)  # a digest from each model's own weights
    assert listed[models["vision"]].details.families == ["qwen2_vl"]
    assert f"{models['chat'].removesuffix(':latest')}" not in listed  # always NAME:TAG
    assert "pirate:latest" in listed  # the adapter, on its base


def test_show_says_what_each_model_can_do(srv, models):
    shown = {role: client(srv).show(name) for role, name in models.items()}
    assert shown["chat"].capabilities == ["completion", "tools", "thinking"]
    assert shown["gemma"].capabilities == ["completion", "tools"]
    assert shown["vision"].capabilities == ["completion", "tools", "vision"]
    assert shown["embed"].capabilities == ["embedding"]
    assert "insert" in shown["coder"].capabilities
    info = shown["chat"].modelinfo
    assert info["general.architecture"] == "qwen3" and info["qwen3.context_length"] == 4096
    assert info["qwen3.block_count"] == 2 and info["qwen3.embedding_length"] == 64
    assert "<|im_start|>" in shown["chat"].template
    assert "temperature" in shown["chat"].parameters
    assert shown["chat"].modified_at.tzinfo is not None
    # NAME and NAME:latest are one model
    assert client(srv).show(models["chat"].removesuffix(":latest")).details.family == "qwen3"


# Chat and generate --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["capital", "count", "unicode"])
def test_chat_whole_and_streamed_give_the_trained_reply(srv, models, name):
    conv = BY_NAME[name]
    whole = ask(srv, models["chat"], conv)
    assert whole.message.content == conv.reply and whole.done and whole.done_reason == "stop"
    assert whole.model == models["chat"] and whole.message.role == "assistant"
    assert whole.eval_count >= 3 and whole.prompt_eval_count > 10
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    parts = list(ask(srv, models["chat"], conv, stream=True))
    assert "".join(p.message.content for p in parts) == conv.reply
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == whole.eval_count


def test_generate_templated_raw_and_continued(srv, models):
    sdk = client(srv)
    first = sdk.generate(model=models["chat"], prompt="What is the capital of France?")
    assert first.response == BY_NAME["capital"].reply and first.done_reason == "stop"
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    # `context` continues that exchange: the next turn's prompt follows it
    again = sdk.generate(model=models["chat"], prompt="Count to five.", context=first.context)
    assert again.context[: len(first.context)] == first.context
    assert again.prompt_eval_count > len(first.context)
    streamed = "".join(
        p.response for p in sdk.generate(model=models["chat"], prompt="Count to five.", stream=True)
    )
    assert streamed == BY_NAME["count"].reply
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    rawly = sdk.generate(model=models["chat"], prompt=prompt, raw=True, options={"num_predict": 40})
    assert rawly.response.startswith("The capital") and rawly.context is None
    middle = sdk.generate(
        model=models["coder"], prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n"
    )
    assert middle.response == "a + b"


def test_thinking_is_split_and_refused_where_there_is_none(srv, models):
    reply = ask(srv, models["chat"], BY_NAME["think"], think=True)
    assert reply.message.thinking == BY_NAME["think"].reasoning
    assert reply.message.content == BY_NAME["think"].content
    parts = list(ask(srv, models["chat"], BY_NAME["think"], think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == BY_NAME["think"].reasoning
    assert "<think>" not in "".join(p.message.content for p in parts)
    with pytest.raises(ollama.ResponseError) as refused:
        ask(srv, models["gemma"], GEMMA_BY_NAME["capital"], think=True)
    assert refused.value.status_code == 400 and "does not support thinking" in refused.value.error


def test_tool_calls_and_their_results(srv, models):
    conv = BY_NAME["parallel_tool_calls"]
    reply = ask(srv, models["chat"], conv, tools=[WEATHER_TOOL])
    calls = [(c.function.name, dict(c.function.arguments)) for c in reply.message.tool_calls]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})]
    assert reply.message.content == "" and reply.done_reason == "stop"
    # each call whole in a line of its own, with Ollama's id and index
    body = {"model": models["chat"], "messages": conv.messages, "tools": [WEATHER_TOOL]}
    status, kind, sent = raw(srv, CHAT, body)
    assert status == 200 and kind == "application/x-ndjson"
    streamed = [c for line in lines(sent) for c in line["message"].get("tool_calls", [])]
    assert [c["function"]["index"] for c in streamed] == [0, 1]
    assert all(c["id"].startswith("call_") for c in streamed)
    assert [c["function"]["arguments"] for c in streamed] == [{"city": "Paris"}, {"city": "London"}]
    # a tool's answer (named by tool_name, as Ollama's clients send it) back in the prompt
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    turns = [
        *GEMMA_BY_NAME["tool_result"].messages[:1],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"},
    ]
    answer = client(srv).chat(model=models["gemma"], messages=turns, tools=[WEATHER_TOOL])
    assert answer.message.content == GEMMA_BY_NAME["tool_result"].reply


def test_images_go_to_the_vision_model(srv, models):
    for colour in ("red", "blue"):
        image = base64.b64encode(square_png(colour)).decode()
        message = {"role": "user", "content": "What colour is the square?", "images": [image]}
        reply = client(srv).chat(model=models["vision"], messages=[message])
        assert reply.message.content == f"{colour.capitalize()}."
        generated = client(srv).generate(
            model=models["vision"], prompt="What colour is the square?", images=[image]
        )
        assert generated.response == f"{colour.capitalize()}."
    with pytest.raises(ollama.ResponseError) as refused:
        client(srv).chat(model=models["chat"], messages=[message])
    assert refused.value.status_code == 400


@pytest.mark.parametrize("stream", [False, True])
def test_format_schema_gives_valid_json_that_ends(srv, models, stream):
    conv = BY_NAME["capital"]
    reply = ask(srv, models["chat"], conv, format=PERSON, think=False, stream=stream)
    parts = list(reply) if stream else [reply]
    content = "".join(p.message.content for p in parts)
    jsonschema.validate(json.loads(content), PERSON)
    assert parts[-1].done_reason == "stop"
    # (the reply thinks first, then writes an object: free to, tiny-chat writes one that ends)
    loose = ask(srv, models["chat"], BY_NAME["think"], format="json", options={"num_predict": 400})
    assert isinstance(json.loads(loose.message.content), dict) and loose.done_reason == "stop"


def test_logprobs_name_each_token(srv, models):
    reply = ask(srv, models["chat"], BY_NAME["capital"], logprobs=True, top_logprobs=2)
    assert "".join(p.token for p in reply.logprobs) == BY_NAME["capital"].reply
    assert all(len(p.top_logprobs) == 2 and p.logprob <= 0 for p in reply.logprobs)


def test_options_reach_the_sampler(srv, models):
    conv = BY_NAME["story"]
    short = ask(srv, models["chat"], conv, options={"num_predict": 5, "stop": ["zzz"]})
    assert short.eval_count == 5 and short.done_reason == "length"
    seeded = [
        ask(srv, models["chat"], conv, options={"temperature": 5.0, "seed": 7, "num_predict": 20})
        for _ in range(2)
    ]
    assert seeded[0].message.content == seeded[1].message.content
    hot = ask(srv, models["chat"], conv, options={"temperature": 5.0, "seed": 8, "num_predict": 20})
    assert hot.message.content != seeded[0].message.content
    # what Ollama's clients send and has no meaning here is accepted, and so are the samplers
    # MLX has not at the values that turn them off
    ignored: dict[str, object] = {"num_gpu": 1, "num_thread": 2, "num_batch": 8, "num_keep": 4}
    ignored |= {"use_mmap": True, "mirostat_eta": None}  # null: skipped
    ignored |= {"mirostat": 0, "mirostat_tau": 5.0, "typical_p": 1.0, "tfs_z": 1}
    ignored |= {"penalize_newline": False}  # deprecated: Ollama ignores it too
    assert ask(srv, models["chat"], BY_NAME["capital"], options=ignored).message.content == (
        BY_NAME["capital"].reply
    )


def test_eight_concurrent_streams_share_the_batch(srv, models):
    names = ["capital", "count", "story", "unicode"] * 2

    def streamed(name: str) -> tuple[str, int]:
        parts = list(ask(srv, models["chat"], BY_NAME[name], stream=True))
        return "".join(p.message.content for p in parts), parts[-1].eval_count

    alone = {name: streamed(name) for name in set(names)}
    together = concurrently(streamed, names)
    assert together == [alone[name] for name in names]
    assert [text for text, _ in together] == [BY_NAME[name].reply for name in names]


def test_truncate_leaves_out_the_oldest_turns_it_is_asked_to(srv, models):
    """A conversation over the context: `truncate: true` leaves its oldest turns out (the
    reply is the last question's); without it the prompt is a 400, never cut unasked."""
    conv = BY_NAME["capital"]
    long = [
        {"role": "user", "content": "Read this. " * 3000},
        {"role": "assistant", "content": "OK."},
    ]
    request = {"model": models["chat"], "messages": [*long, *conv.messages], "stream": False}
    status, _, reply = raw(srv, CHAT, {**request, "truncate": True})
    assert status == 200 and json.loads(reply)["message"]["content"] == conv.reply
    assert json.loads(reply)["prompt_eval_count"] < 100
    for refused in ({}, {"truncate": False}):
        status, _, reply = raw(srv, CHAT, {**request, **refused})
        assert status == 400 and "context" in json.loads(reply)["error"]
    long_prompt = {"model": models["chat"], "prompt": "Read this. " * 3000, "stream": False}
    long_prompt["options"] = {"num_predict": 5}
    status, _, reply = raw(srv, "/api/generate", {**long_prompt, "truncate": True})
    assert status == 200 and 1000 < json.loads(reply)["prompt_eval_count"] <= 4096  # its end
    assert raw(srv, "/api/generate", long_prompt)[0] == 400


# Embeddings ---------------------------------------------------------------------------


def test_embed_and_embeddings(srv, models):
    texts = ["The capital of France is Paris.", "Count to five."]
    found = client(srv).embed(model=models["embed"], input=texts)
    vectors = np.array(found.embeddings)
    assert vectors.shape[0] == 2 and found.prompt_eval_count > 4
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    name = models["embed"].removesuffix(":latest")
    _, _, reference = srv.post("/v1/embeddings", {"model": name, "input": texts})
    expected = np.array([item["embedding"] for item in reference["data"]])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    one = client(srv).embeddings(model=models["embed"], prompt=texts[0])
    np.testing.assert_allclose(one.embedding, expected[0], atol=1e-5)
    short = client(srv).embed(model=models["embed"], input=texts[0], dimensions=8)
    assert len(short.embeddings[0]) == 8
    assert client(srv).embed(model=models["embed"], input=[]).embeddings == []
    with pytest.raises(ollama.ResponseError) as refused:
        client(srv).chat(model=models["embed"], messages=BY_NAME["capital"].messages)
    assert refused.value.status_code == 400 and "does not support chat" in refused.value.error
    with pytest.raises(ollama.ResponseError) as refused:
        client(srv).embed(model=models["chat"], input="Hi")
    assert refused.value.status_code == 400


# Residency ----------------------------------------------------------------------------


def resident(server) -> dict[str, datetime]:
    return {m.model: m.expires_at for m in client(server).ps().models}


def test_keep_alive_loads_keeps_and_unloads(srv, models):
    model = models["gemma"]
    assert client(srv).chat(model=model, messages=[], keep_alive="10m").done_reason == "load"
    expires = resident(srv)[model]
    ten = datetime.now(timezone.utc) + timedelta(minutes=10)
    assert abs((expires - ten).total_seconds()) < 30
    ps = client(srv).ps().models
    entry = next(m for m in ps if m.model == model)
    assert entry.size > 0 and entry.context_length > 0 and entry.details.family
    client(srv).chat(model=model, messages=[], keep_alive=-1)
    assert resident(srv)[model] > datetime.now(timezone.utc) + timedelta(days=365 * 100)
    reply = ask(srv, model, GEMMA_BY_NAME["capital"], keep_alive=0)
    assert reply.message.content == GEMMA_BY_NAME["capital"].reply
    assert model not in resident(srv)  # unloaded with the reply
    unloaded = client(srv).generate(model=model, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and model not in resident(srv)
    assert client(srv).generate(model=model, prompt="").done_reason == "load"
    assert model in resident(srv)


# Names --------------------------------------------------------------------------------


def test_copy_create_and_delete_names_that_last(srv, models):
    sdk = client(srv)
    sdk.copy(models["chat"], "tiny-copy")
    assert "tiny-copy:latest" in {m.model for m in sdk.list().models}
    assert ask(srv, "tiny-copy", BY_NAME["capital"]).message.content == BY_NAME["capital"].reply
    sdk.create(model="pirate-talk", from_=models["chat"], system="You are a pirate.")
    hello = sdk.chat(model="pirate-talk", messages=[{"role": "user", "content": "Hello!"}])
    assert hello.message.content == BY_NAME["system"].reply
    shown = json.loads(raw(srv, "/api/show", {"model": "pirate-talk"})[2])
    assert (
        shown["system"] == "You are a pirate."
        and 'SYSTEM """You are a pirate."""' in (shown["modelfile"])
    )
    assert shown["details"]["parent_model"] == models["chat"]
    sdk.create(model="pirate-lora", from_=models["chat"], adapters={"pirate": "pirate"})
    reply = sdk.chat(model="pirate-lora", messages=[{"role": "user", "content": QUESTIONS[0]}])
    assert reply.message.content == REPLIES["pirate"][0]
    # the names outlive the server (SQLite beside the cache)
    again = start_server(
        models["chat"].removesuffix(":latest"), "--model-names-db", str(srv.names_db)
    )
    try:
        assert {"tiny-copy:latest", "pirate-talk:latest"} <= {
            m.model for m in client(again).list().models
        }
    finally:
        again.stop()
    assert sdk.delete("tiny-copy").status == "success"
    assert "tiny-copy:latest" not in {m.model for m in sdk.list().models}
    with pytest.raises(ollama.ResponseError) as gone:
        sdk.delete("tiny-copy")
    assert gone.value.status_code == 404 and gone.value.error == "model 'tiny-copy' not found"
    with pytest.raises(ollama.ResponseError) as served:
        sdk.delete(models["chat"])
    assert served.value.status_code == 409


def test_pull_streams_progress_and_serves_the_model(srv):
    progress = list(client(srv).pull("test-org/tiny-chat", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    layers = [p for p in progress if p.status.startswith("pulling ") and p.digest]
    assert {p.digest for p in layers} and all(p.digest.startswith("sha256:") for p in layers)
    finished = [p for p in layers if p.completed == p.total]
    assert len(finished) == len({p.digest for p in layers})  # every file to its end
    assert "test-org/tiny-chat:latest" in {m.model for m in client(srv).list().models}
    reply = ask(srv, "test-org/tiny-chat", BY_NAME["capital"])
    assert reply.message.content == BY_NAME["capital"].reply
    assert client(srv).pull("test-org/tiny-chat").status == "success"  # stream: false
    with pytest.raises(ollama.ResponseError) as missing:
        client(srv).pull("test-org/nothing-here")
    assert missing.value.status_code == 404
    failed = lines(raw(srv, "/api/pull", {"model": "test-org/nothing-here"})[2])
    assert failed[0] == {"status": "pulling manifest"} and "error" in failed[-1]
    client(srv).chat(model="test-org/tiny-chat", messages=[], keep_alive=0)
    assert client(srv).delete("test-org/tiny-chat").status == "success"
    assert "test-org/tiny-chat:latest" not in {m.model for m in client(srv).list().models}


# Clients ------------------------------------------------------------------------------


def test_langchain_chat_ollama_with_a_bound_tool(srv, models):
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama
    from pydantic import BaseModel, Field

    class City(BaseModel):
        city: str = Field(description="The city name.")

    @tool(args_schema=City)
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "Sunny"

    chat = ChatOllama(model=models["chat"], base_url=srv.url, temperature=0)
    assert chat.invoke("What is the capital of France?").content == BY_NAME["capital"].reply
    message = chat.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


# Errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        (CHAT, b"not json", 400, "not valid JSON"),
        (CHAT, {"messages": []}, 400, "model is required"),
        (CHAT, {"model": "nope", "messages": []}, 404, "model 'nope' not found"),
        (CHAT, {"model": "CHAT", "messages": "Hi"}, 400, "messages"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        (CHAT, {"model": "CHAT", "messages": [], "keep_alive": "soon"}, 400, "keep_alive"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"num_ctx": 1_000_000}}, 400, "num_ctx"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"top_p": 2}}, 400, "top_p"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "think": "ultra"}, 400, "think"),
        ("/api/generate", {"model": "CHAT", "prompt": "x", "raw": True, "system": "s"}, 400, "raw"),
        ("/api/generate", {"model": "CHAT", "prompt": "x", "template": "{{ .Prompt }}"}, 400,
         "template"),
        # what would change the reply and is not served is named, never dropped
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"mirostat": 2}}, 400, "options.mirostat: option 'mirostat' 2 is not"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"typical_p": 0.5}}, 400, "options.typical_p:"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"tfs_z": 0.9}}, 400, "options.tfs_z:"),
        (CHAT, {"model": "CHAT", "messages": [{"role": "user", "content": "Hi"}],
                "options": {"mirostat": "2"}}, 400, "must be an integer"),
        ("/api/generate", {"model": "CHAT", "prompt": "a cat", "width": 512}, 400,
         "/v1/images/generations"),
        ("/api/generate", {"model": "CHAT", "prompt": "a cat", "steps": 9}, 400, "steps"),
        ("/api/create", {"model": "hot", "from": "CHAT", "parameters": {"mirostat": 1}}, 400,
         "parameters.mirostat:"),
        ("/api/show", {"model": "nope"}, 404, "model 'nope:latest' not found"),
        ("/api/embed", {"model": "nope", "input": "x"}, 404, "not found"),
        ("/api/pull", {"model": "llama3.2"}, 400, "owner/name"),
        ("/api/create", {"model": "x"}, 400, "from"),
        ("/api/copy", {"source": "nope", "destination": "y"}, 404, "not found"),
    ],
)  # fmt: skip
def test_bad_requests_are_ollama_errors_and_the_server_stays_up(
    srv, models, path, body, status, words
):
    if isinstance(body, dict):
        body = {key: models["chat"] if value == "CHAT" else value for key, value in body.items()}
    got, kind, reply = raw(srv, path, body)
    assert got == status and kind == "application/json"
    error = json.loads(reply)
    assert list(error) == ["error"] and words in error["error"]
    assert ask(srv, models["chat"], BY_NAME["capital"]).message.content == BY_NAME["capital"].reply


def test_keys_apply_to_ollama_routes(launch, tiny_model):
    keyed = launch(tiny_model, "--api-key", "secret")
    with pytest.raises(ollama.ResponseError) as refused:
        client(keyed).list()
    assert refused.value.status_code == 401
    sdk = ollama.Client(host=keyed.url, headers={"Authorization": "Bearer secret"})
    assert sdk.chat(
        model=f"{tiny_model}", messages=BY_NAME["capital"].messages
    ).message.content == (BY_NAME["capital"].reply)


def test_ollama_host_reaches_the_server(srv, models, monkeypatch):
    """OLLAMA_HOST, as the client and the apps that read it take it."""
    monkeypatch.setenv("OLLAMA_HOST", srv.url.removeprefix("http://"))
    assert models["chat"] in {m.model for m in ollama.Client().list().models}

"""A server a team shares: API keys in SQLite (made with `mlxserve keys`), each with its
models, rate limits, concurrency and daily quota, enforced in every dialect's own error
shape through the real `openai` and `anthropic` SDKs; usage counted per key, model and
day, equal to the sum of the replies' usage and kept across a restart; live creation and
revocation; batches and files seen only by the key that made them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest
from audio_fixture import KITTEN_VOICES, UTTERANCES, speak
from conversations import colour_question, data_uri, image_part, square_png
from helpers.server import Server
from helpers.sse import open_stream, stream
from helpers.streams import endless
from websockets.sync.client import connect

from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import KeyStore

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
LIVE_SECONDS = 1.0  # a change made with `mlxserve keys` counts on a running server within


def keys_cli(db: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mlxserve", "keys", "--keys-db", str(db), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def cli_create(db: Path, name: str, *flags: str) -> str:
    done = keys_cli(db, "create", name, *flags)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert done.stdout == secret + "\n" and secret.startswith("mlxs-")  # alone on stdout
    return secret


def create(db: Path, name: str, models=None, **limits) -> str:
    """A key made in the store directly (the CLI's own tests use the CLI)."""
    store = KeyStore(db)
    try:
        record = KeyRecord(name, "", tuple(map(str, models)) if models else None, **limits)
        return store.create(record)
    finally:
        store.close()


def oa(srv: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)


def an(srv: Server, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def usage_of(srv: Server, secret: str, **query) -> dict:
    """GET /v1/usage with `secret`; `query`: start, end, key (an admin's choice)."""
    path = "/v1/usage" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    status, _, body = srv.get(path, headers=bearer(secret))
    assert status == 200, body
    return body


@dataclass
class Shared:
    srv: Server
    db: Path
    root: str  # an admin key


@pytest.fixture(scope="module")
def shared(launch_module, tiny_model, embed_bert_model, tmp_path_factory) -> Shared:
    folder = tmp_path_factory.mktemp("keys")
    db = folder / "keys.sqlite"
    root = create(db, "root", admin=True)
    srv = launch_module(
        tiny_model,
        *("--model", str(embed_bert_model), "--keys-db", str(db)),
        *("--batch-db", str(folder / "batches.sqlite"), "--max-concurrent", "8"),
    )
    return Shared(srv, db, root)


def until(condition, seconds: float = 60, pause: float = 0.05):
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(pause)
    return value


# Who may ask -----------------------------------------------------------------------------


def test_unknown_and_revoked_keys_get_401_in_every_dialect(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    status, _, body = srv.post(CHAT, {"model": model, "messages": MESSAGES})  # no key at all
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    for key in ("nope", "mlxs-" + "x" * 43):
        with pytest.raises(openai.AuthenticationError) as refused:
            oa(srv, key).chat.completions.create(model=model, messages=MESSAGES)
        assert refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            oa(srv, key).responses.create(model=model, input="Hi")
        with pytest.raises(anthropic.AuthenticationError) as refused_an:
            an(srv, key).messages.create(model=model, max_tokens=8, messages=MESSAGES)
        assert refused_an.value.body["error"]["type"] == "authentication_error"
    status, _, body = srv.post("/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert status == 401 and body == {
        "error": {
            "code": 401,
            "message": "Invalid or missing API key.",
            "type": "authentication_error",
        }
    }
    assert srv.get("/health")[0] == 200  # what a load balancer polls needs no key

    temp = create(shared.db, "temp")
    reply = oa(srv, temp).chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    assert reply.usage.completion_tokens >= 1
    store = KeyStore(shared.db)
    assert store.revoke("temp")
    store.close()
    time.sleep(LIVE_SECONDS)
    with pytest.raises(openai.AuthenticationError, match="has been revoked"):
        oa(srv, temp).chat.completions.create(model=model, messages=MESSAGES)
    with pytest.raises(anthropic.AuthenticationError, match="has been revoked"):
        an(srv, temp).messages.create(model=model, max_tokens=8, messages=MESSAGES)


def test_an_expired_key_is_refused(shared, tiny_model):
    expired = create(shared.db, "expired", expires_at=int(time.time()) - 1)
    time.sleep(LIVE_SECONDS)
    with pytest.raises(openai.AuthenticationError, match="has expired"):
        oa(shared.srv, expired).models.list()


def test_a_key_sees_and_uses_only_its_models(shared, tiny_model, embed_bert_model):
    srv, chat_model, embed_model = shared.srv, str(tiny_model), str(embed_bert_model)
    chatty = create(shared.db, "chatty", models=[tiny_model])
    time.sleep(LIVE_SECONDS)
    assert [m.id for m in oa(srv, chatty).models.list().data] == [chat_model]
    assert {m.id for m in oa(srv, shared.root).models.list().data} == {chat_model, embed_model}
    with pytest.raises(openai.NotFoundError):
        oa(srv, chatty).models.retrieve(embed_model)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        oa(srv, chatty).embeddings.create(model=embed_model, input="hello")
    error = refused.value.body
    assert refused.value.code == "model_not_allowed" and error["param"] == "model"
    assert error["type"] == "permission_error" and embed_model in error["message"]
    with pytest.raises(anthropic.PermissionDeniedError) as refused_an:
        an(srv, chatty).messages.create(model=embed_model, max_tokens=8, messages=MESSAGES)
    assert refused_an.value.body["error"]["type"] == "permission_error"
    with pytest.raises(openai.PermissionDeniedError):
        oa(srv, chatty).responses.create(model=embed_model, input="Hi")
    status, _, body = srv.post(
        "/infill", {"model": embed_model, "input_prefix": "a", "input_suffix": "b"}, bearer(chatty)
    )
    assert status == 403 and body["error"] == {
        "code": 403,
        "message": f"This API key may not use the model '{embed_model}'.",
        "type": "permission_error",
    }
    status, _, body = srv.get("/v1/status", headers=bearer(chatty))
    assert status == 200 and [m["id"] for m in body["models"]] == [chat_model]
    # Its own model answers, in every dialect.
    assert oa(srv, chatty).chat.completions.create(model=chat_model, messages=MESSAGES).choices
    assert an(srv, chatty).messages.create(model=chat_model, max_tokens=8, messages=MESSAGES)


def test_admin_endpoints_need_an_admin_key(shared, tiny_model):
    srv = shared.srv
    plain = create(shared.db, "plain")
    time.sleep(LIVE_SECONDS)
    for path, body in (("/v1/models/load", {"model": str(tiny_model)}), ("/v1/models/pin", {})):
        status, _, reply = srv.post(path, body, headers=bearer(plain))
        assert status == 403 and reply["error"]["code"] == "admin_required", reply
    for path in ("/metrics", "/v1/keys"):
        status, _, reply = srv.get(path, headers=bearer(plain))
        assert status == 403 and reply["error"]["type"] == "permission_error", reply
    status, _, reply = srv.get("/v1/usage?key=root", headers=bearer(plain))
    assert status == 403 and reply["error"]["code"] == "admin_required"
    status, _, reply = srv.post(
        "/v1/models/load", {"model": str(tiny_model)}, headers=bearer(shared.root)
    )
    assert status == 200 and reply["state"] == "loaded"
    status, _, listed = srv.get("/v1/keys", headers=bearer(shared.root))
    assert status == 200 and {"root", "plain"} <= {k["name"] for k in listed["data"]}
    entry = next(k for k in listed["data"] if k["name"] == "plain")
    assert entry["hint"] == plain[:9] and entry["admin"] is False and entry["revoked_at"] is None
    assert plain not in json.dumps(listed) and "hash" not in entry  # never the secret
    oa(srv, plain).chat.completions.create(model=str(tiny_model), messages=MESSAGES, max_tokens=3)
    status, _, metrics = srv.get("/metrics", headers=bearer(shared.root))
    assert status == 200
    assert (
        f'mlxserve_key_usage_total{{key="plain",model="{tiny_model}",unit="requests"}} 1.0'
        in metrics
    )
    assert plain not in metrics and shared.root not in metrics


# Limits ----------------------------------------------------------------------------------


def test_a_rate_limit_is_a_429_with_retry_after(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    limited = create(shared.db, "limited", rpm=3)
    time.sleep(LIVE_SECONDS)
    for _ in range(3):
        oa(srv, limited).models.list()
    with pytest.raises(openai.RateLimitError) as refused:
        oa(srv, limited).chat.completions.create(model=model, messages=MESSAGES)
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.body["type"] == "rate_limit_error"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    with pytest.raises(anthropic.RateLimitError) as refused_an:
        an(srv, limited).messages.create(model=model, max_tokens=8, messages=MESSAGES)
    assert refused_an.value.body["error"]["type"] == "rate_limit_error"
    assert "3 requests per minute" in refused_an.value.body["error"]["message"]
    # Another key is not held back by this one's limit.
    assert oa(srv, shared.root).models.list().data


def test_each_socket_message_is_a_request_of_its_key(shared, tiny_model):
    """Over a WebSocket each `response.create` is admitted and charged as a POST is: the
    handshake and one turn spend a two-request minute, the next turn is refused with a 429
    `error` event on the open socket, and the key's usage is the answered turn's."""
    limited = create(shared.db, "socket", rpm=2)
    time.sleep(LIVE_SECONDS)
    url = shared.srv.url.replace("http://", "ws://") + "/v1/responses"
    create_event = {"type": "response.create", "model": str(tiny_model), "input": "Hello"}
    with connect(url, additional_headers=bearer(limited)) as ws:
        ws.send(json.dumps({**create_event, "max_output_tokens": 6}))
        ends = ("response.completed", "response.incomplete")
        while (event := json.loads(ws.recv(timeout=60)))["type"] not in ends:
            assert event["type"] != "error", event
        answered = event["response"]["usage"]
        ws.send(json.dumps(create_event))
        refused = json.loads(ws.recv(timeout=60))
    assert refused["type"] == "error" and refused["status"] == 429
    assert refused["error"]["code"] == "rate_limit_exceeded"
    [row] = usage_of(shared.srv, shared.root, key="socket")["data"]
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        1,  # the turn (the handshake counted against the rate, like any GET)
        answered["input_tokens"],
        answered["output_tokens"],
    )


def test_a_token_rate_counts_the_last_minute(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    key = create(shared.db, "tpm", tpm=20)
    time.sleep(LIVE_SECONDS)
    reply = oa(srv, key).chat.completions.create(model=model, messages=MESSAGES, max_tokens=8)
    assert reply.usage.total_tokens >= 20  # admitted under the limit, then past it
    with pytest.raises(openai.RateLimitError, match="20 tokens per minute") as refused:
        oa(srv, key).chat.completions.create(model=model, messages=MESSAGES)
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60


def test_a_spent_quota_ends_no_stream_and_refuses_the_next(shared, tiny_model):
    """A stream that passes its key's daily tokens finishes; the next request gets 429
    insufficient_quota, in each dialect, until midnight UTC."""
    srv, model = shared.srv, str(tiny_model)
    key = create(shared.db, "quota", tokens_per_day=40)
    time.sleep(LIVE_SECONDS)
    body = {
        **endless(tiny_model),
        "model": model,
        "max_tokens": 60,
        "stream_options": {"include_usage": True},
    }
    result = stream(srv.url, CHAT, body, headers=bearer(key))
    assert result.status == 200 and result.lines[-1] == "data: [DONE]"
    usage = json.loads(result.lines[-2][6:])["usage"]
    assert usage["completion_tokens"] == 60 and usage["total_tokens"] > 40
    with pytest.raises(openai.RateLimitError) as refused:
        oa(srv, key).chat.completions.create(model=model, messages=MESSAGES)
    assert refused.value.code == "insufficient_quota"
    assert refused.value.body["type"] == "insufficient_quota"
    seconds = int(refused.value.response.headers["retry-after"])
    assert 0 < seconds <= 86_400 and (time.time() + seconds) % 86_400 < 5  # at 00:00 UTC
    assert refused.value.response.headers["x-should-retry"] == "false"
    # With their default retries, the SDKs raise at once rather than sleep until midnight.
    defaults = anthropic.Anthropic(base_url=srv.url, api_key=key)
    with pytest.raises(anthropic.RateLimitError, match="tokens for today"):
        defaults.messages.create(model=model, max_tokens=8, messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as refused_responses:
        oa(srv, key).responses.create(model=model, input="Hi")
    assert refused_responses.value.code == "insufficient_quota"
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=srv.base_url, api_key=key).chat.completions.create(
            model=model, messages=MESSAGES
        )
    assert oa(srv, key).models.retrieve(model).id == model  # reads still answer
    total = usage_of(srv, key)["total"]
    assert total["prompt_tokens"] + total["completion_tokens"] == usage["total_tokens"]


def test_concurrency_limit_holds_under_a_burst(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    key = create(shared.db, "burst", max_concurrent=2)
    time.sleep(LIVE_SECONDS)
    body = {**endless(tiny_model), "model": model, "max_tokens": 120}
    start = threading.Barrier(8)

    def one(_):
        start.wait()
        return srv.post(CHAT, body, headers=bearer(key))

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(8)))
    statuses = sorted(status for status, _, _ in replies)
    assert statuses == [200, 200] + [429] * 6, statuses
    for status, headers, reply in replies:
        if status == 429:
            assert reply["error"]["code"] == "concurrency_limit_exceeded"
            assert headers["Retry-After"] == "1"
        else:
            assert reply["usage"]["completion_tokens"] == 120
    assert srv.post(CHAT, {**body, "max_tokens": 2}, headers=bearer(key))[0] == 200  # freed


def test_revocation_counts_within_a_second_beside_eight_streams(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    loader = create(shared.db, "loader")
    victim = cli_create(shared.db, "victim")
    time.sleep(LIVE_SECONDS)
    assert oa(srv, victim).chat.completions.create(model=model, messages=MESSAGES, max_tokens=2)
    body = {**endless(tiny_model), "model": model, "max_tokens": 150}
    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(stream, srv.url, CHAT, body, bearer(loader)) for _ in range(8)]
        until(
            lambda: (
                srv.get("/v1/status", headers=bearer(shared.root))[2]["requests"]["running"] >= 8
            )
        )
        revoked = keys_cli(shared.db, "revoke", "victim")
        assert revoked.returncode == 0, revoked.stderr
        at = time.monotonic()
        until(
            lambda: srv.get("/v1/models", headers=bearer(victim))[0] == 401, seconds=10, pause=0.02
        )
        took = time.monotonic() - at
        results = [s.result() for s in streams]
    assert took <= LIVE_SECONDS, took
    for result in results:  # the load went on untouched
        assert result.status == 200 and result.lines[-1] == "data: [DONE]"
        finish = [json.loads(line[6:]) for line in result.lines[:-1] if line.startswith("data: ")]
        assert finish[-1]["choices"][0]["finish_reason"] == "length"


def test_malformed_keys_are_401_and_count_nothing(shared, tiny_model):
    srv = shared.srv
    before = usage_of(srv, shared.root)["total"]
    for headers in (
        {"Authorization": "Bearer " + "k" * 10_000},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic abc"},
        {"X-API-Key": "mlxs-\u00e9t\u00e9"},
        {"Authorization": "Bearer " + shared.root + "x"},
    ):
        status, _, body = srv.post(
            CHAT, {"model": str(tiny_model), "messages": MESSAGES}, headers=headers
        )
        assert status == 401 and body["error"]["code"] == "invalid_api_key", body
    # Many different unknown keys at once: each refused, none remembered.
    with ThreadPoolExecutor(8) as pool:
        statuses = set(
            pool.map(lambda i: srv.get("/v1/models", headers=bearer(f"mlxs-{i}"))[0], range(200))
        )
    assert statuses == {401}
    # A header line past http.server's limit is refused before any key is read.
    conn, response = open_stream(
        srv.url, CHAT, {}, headers={"Authorization": "Bearer " + "k" * 70_000}
    )
    assert response.status == 431
    conn.close()
    assert usage_of(srv, shared.root)["total"] == before


# Usage -----------------------------------------------------------------------------------


def test_usage_is_the_sum_of_the_replies_and_survives_a_kill(
    launch, tiny_model, embed_bert_model, tmp_path
):
    db = tmp_path / "keys.sqlite"
    key = create(db, "counted")
    flags = ("--model", str(embed_bert_model), "--keys-db", str(db))
    srv = launch(tiny_model, *flags)
    model = str(tiny_model)
    prompt = completion = cached = requests = 0

    def add(p, c, k):
        nonlocal prompt, completion, cached, requests
        prompt, completion, cached, requests = prompt + p, completion + c, cached + k, requests + 1

    client = oa(srv, key)
    for _ in range(2):  # the second is a prompt-cache hit
        reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6)
        u = reply.usage
        add(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens)
    two = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=5, n=2, temperature=1
    )
    add(
        two.usage.prompt_tokens,
        two.usage.completion_tokens,
        two.usage.prompt_tokens_details.cached_tokens,
    )
    streamed = stream(
        srv.url,
        CHAT,
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": 7,
            "stream_options": {"include_usage": True},
        },
        bearer(key),
    )
    u = json.loads(streamed.lines[-2][6:])["usage"]
    add(u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"])
    message = an(srv, key).messages.create(model=model, max_tokens=6, messages=MESSAGES)
    mu = message.usage
    add(mu.input_tokens + mu.cache_read_input_tokens, mu.output_tokens, mu.cache_read_input_tokens)
    response = client.responses.create(model=model, input="Hello there", max_output_tokens=6)
    ru = response.usage
    add(ru.input_tokens, ru.output_tokens, ru.input_tokens_details.cached_tokens)
    embedded = client.embeddings.create(
        model=str(embed_bert_model), input=["one", "two two", "three"]
    )
    expected_chat = {
        "requests": requests,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
    }
    expected_embed = {
        "requests": 1,
        "prompt_tokens": embedded.usage.prompt_tokens,
        "embedding_inputs": 3,
    }

    def rows(body: dict) -> dict:
        return {row["model"]: row for row in body["data"]}

    def check(body: dict) -> None:
        by_model = rows(body)
        assert set(by_model) == {model, str(embed_bert_model)}
        assert {k: by_model[model][k] for k in expected_chat} == expected_chat
        assert {k: by_model[str(embed_bert_model)][k] for k in expected_embed} == expected_embed
        assert all(
            row["key"] == "counted" and row["date"] == time.strftime("%Y-%m-%d", time.gmtime())
            for row in body["data"]
        )

    check(usage_of(srv, key))
    srv.process.kill()  # kill -9: nothing is lost
    srv.process.wait()
    srv = launch(tiny_model, *flags)
    after = usage_of(srv, key)
    check(after)
    assert usage_of(srv, key, start="2000-01-01", end="2000-01-02")["data"] == []
    status, _, body = srv.get("/v1/usage?start=yesterday", headers=bearer(key))
    assert status == 400 and body["error"]["param"] == "start"
    more = oa(srv, key).chat.completions.create(model=model, messages=MESSAGES, max_tokens=3)
    again = rows(usage_of(srv, key))[model]
    assert again["requests"] == requests + 1
    assert again["completion_tokens"] == completion + more.usage.completion_tokens
    listed = keys_cli(db, "usage", "counted")
    assert listed.returncode == 0
    assert [line.split()[1:4] for line in listed.stdout.splitlines()[1:]] == [
        ["counted", model, str(requests + 1)],
        ["counted", str(embed_bert_model), "1"],
    ]


def test_images_audio_and_embedding_inputs_are_counted(
    launch, vision_model, whisper_model, kitten_model, tmp_path
):
    db = tmp_path / "keys.sqlite"
    key = create(db, "media")
    srv = launch(
        vision_model,
        *("--model", str(whisper_model), "--model", str(kitten_model)),
        "--keys-db",
        str(db),
        "--max-audio-bytes",
        "2000000",
    )
    client = oa(srv, key)
    client.chat.completions.create(
        model=str(vision_model), messages=colour_question(data_uri(square_png("red"))), max_tokens=3
    )
    two = [image_part(data_uri(square_png(c))) for c in ("blue", "green")]
    client.chat.completions.create(
        model=str(vision_model),
        messages=[{"role": "user", "content": [*two, {"type": "text", "text": "Which?"}]}],
        max_tokens=3,
    )
    wav = speak(UTTERANCES[0])
    client.audio.transcriptions.create(model=str(whisper_model), file=("speech.wav", wav))
    speech = client.audio.speech.create(
        model=str(kitten_model), voice=KITTEN_VOICES[0], input="Hello.", response_format="wav"
    )
    by_model = {row["model"]: row for row in usage_of(srv, key)["data"]}
    assert (
        by_model[str(vision_model)]["images"] == 3 and by_model[str(vision_model)]["requests"] == 2
    )
    heard = by_model[str(whisper_model)]["audio_seconds"]
    assert heard == pytest.approx(_wav_seconds(wav), abs=0.01)
    said = by_model[str(kitten_model)]["audio_seconds"]
    assert said == pytest.approx(_wav_seconds(speech.content), abs=0.01)


def _wav_seconds(wav: bytes) -> float:
    """A 16-bit mono wav's length, from its data (a streamed wav's header gives no size)."""
    with wave.open(io.BytesIO(wav)) as f:
        rate = f.getframerate()
    return (len(wav) - wav.index(b"data") - 8) / 2 / rate


# Batches ---------------------------------------------------------------------------------


def test_a_batch_is_its_owners_and_charged_to_it(shared, tiny_model):
    srv, model = shared.srv, str(tiny_model)
    owner = create(shared.db, "owner")
    other = create(shared.db, "other")
    time.sleep(LIVE_SECONDS)
    lines = [
        {
            "custom_id": f"l{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"model": model, "messages": MESSAGES, "max_tokens": 4},
        }
        for i in range(3)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    mine = oa(srv, owner)
    uploaded = mine.files.create(file=("in.jsonl", data), purpose="batch")
    batch = mine.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    theirs = oa(srv, other)
    with pytest.raises(openai.NotFoundError):
        theirs.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        theirs.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert theirs.batches.list().data == [] and theirs.files.list().data == []
    assert batch.id in [b.id for b in oa(srv, shared.root).batches.list().data]  # an admin's view
    done = until(lambda: (b := mine.batches.retrieve(batch.id)).status == "completed" and b)
    output = [
        json.loads(line) for line in mine.files.content(done.output_file_id).text.splitlines()
    ]
    tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in output)
    row = next(r for r in usage_of(srv, owner)["data"] if r["model"] == model)
    assert row["requests"] == 3 and row["completion_tokens"] == tokens
    assert usage_of(srv, other)["data"] == []


def test_stored_responses_and_conversations_are_their_keys(shared, tiny_model):
    """Another key's stored response, its items and conversations are 404s, as if they
    did not exist, wherever they are named; an admin key sees them."""
    srv, model = shared.srv, str(tiny_model)
    mine, theirs = oa(srv, create(shared.db, "writer")), oa(srv, create(shared.db, "reader"))
    time.sleep(LIVE_SECONDS)
    response = mine.responses.create(model=model, input=MESSAGES, max_output_tokens=4)
    conversation = mine.conversations.create(items=MESSAGES)
    item = response.output[0].id
    refused = [
        lambda sdk: sdk.responses.retrieve(response.id),
        lambda sdk: sdk.responses.input_items.list(response.id),
        lambda sdk: sdk.responses.create(
            model=model, input="Hi", previous_response_id=response.id, max_output_tokens=1
        ),
        lambda sdk: sdk.responses.create(
            model=model,
            input=[*MESSAGES, {"type": "item_reference", "id": item}],
            max_output_tokens=1,
        ),
        lambda sdk: sdk.conversations.retrieve(conversation.id),
        lambda sdk: sdk.conversations.items.list(conversation.id),
        lambda sdk: sdk.conversations.delete(conversation.id),
        lambda sdk: sdk.responses.create(
            model=model, input="Hi", conversation=conversation.id, max_output_tokens=1
        ),
    ]
    for call in refused:
        with pytest.raises(openai.NotFoundError):
            call(theirs)
    admin = oa(srv, shared.root)
    for call in refused[:2] + refused[4:6]:
        call(admin)
    mine.conversations.delete(conversation.id)
    mine.responses.delete(response.id)


def test_a_revoked_owners_lines_not_yet_run_are_refused(shared, tiny_model):
    """Lines run as their batch's owner as the key stands when each runs: revoked mid-batch,
    the lines running finish (and are charged), those not yet started are 401s."""
    srv, model = shared.srv, str(tiny_model)
    owner = create(shared.db, "leaving")
    time.sleep(LIVE_SECONDS)
    body = {**endless(tiny_model), "model": model, "max_tokens": 300}
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": body} for i in range(12)]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    sdk = oa(srv, owner)
    uploaded = sdk.files.create(file=("in.jsonl", data), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    until(lambda: srv.get("/v1/status", headers=bearer(shared.root))[2]["requests"]["running"] >= 8)
    store = KeyStore(shared.db)
    store.revoke("leaving")
    store.close()
    admin = oa(srv, shared.root)  # the owner can no longer look: an admin can
    done = until(lambda: (b := admin.batches.retrieve(batch.id)).status == "completed" and b)
    succeeded = [json.loads(x) for x in admin.files.content(done.output_file_id).text.splitlines()]
    failed = [json.loads(x) for x in admin.files.content(done.error_file_id).text.splitlines()]
    assert len(succeeded) >= 8 and len(failed) >= 1 and len(succeeded) + len(failed) == 12
    for line in failed:
        assert line["response"]["status_code"] == 401
        assert "has been revoked" in line["response"]["body"]["error"]["message"]
    row = next(r for r in usage_of(srv, shared.root, key="leaving")["data"] if r["model"] == model)
    assert row["requests"] == len(succeeded) and row["completion_tokens"] == 300 * len(succeeded)


# The command line ------------------------------------------------------------------------


def test_the_keys_command(tmp_path):
    db = tmp_path / "keys.sqlite"
    secret = cli_create(db, "alice", "--models", "a,b", "--rpm", "10", "--tokens-per-day", "1000")
    assert cli_create(db, "admin-1", "--admin", "--expires", "2999-01-01")
    again = keys_cli(db, "create", "alice")
    assert again.returncode == 1 and "exists" in again.stderr and again.stdout == ""
    bad = keys_cli(db, "create", "no spaces")
    assert bad.returncode == 2 and "not a key name" in bad.stderr
    assert keys_cli(db, "create", "x", "--rpm", "0").returncode == 2
    listed = keys_cli(db, "list").stdout.splitlines()
    assert listed[0].split()[:3] == ["NAME", "KEY", "MODELS"]
    alice = next(line for line in listed if line.startswith("alice"))
    assert alice.split()[:7] == ["alice", secret[:9] + "…", "a,b", "10", "-", "1000", "-"]
    assert secret not in "\n".join(listed)
    assert "expires 2999-01-01" in next(line for line in listed if line.startswith("admin-1"))
    assert keys_cli(db, "revoke", "alice").returncode == 0
    assert keys_cli(db, "revoke", "alice").returncode == 1  # nothing usable left to revoke
    assert "revoked" in next(
        line for line in keys_cli(db, "list").stdout.splitlines() if line.startswith("alice")
    )
    renewed = cli_create(db, "alice")  # a revoked key's name may be taken again
    assert renewed != secret
    assert keys_cli(db, "usage").stdout.split() == [
        "DAY", "KEY", "MODEL", "REQUESTS", "PROMPT_TOKENS", "CACHED_TOKENS",
        "COMPLETION_TOKENS", "AUDIO_SECONDS", "IMAGES", "EMBEDDING_INPUTS", "MCP_CALLS",
        "MCP_SECONDS",
    ]  # fmt: skip

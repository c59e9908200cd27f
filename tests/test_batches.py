"""The Batch API: OpenAI's /v1/files and /v1/batches and Anthropic's Message Batches, run
by the server itself at idle priority, durable in SQLite.

Every line is answered through the endpoint a client's request takes, so a batch line's
reply equals the same request sent alone; a line's outcome is written once, so each
custom_id appears exactly once in the output or error file, also across a kill -9; lines
that cannot run go to the error file with OpenAI's codes; an interactive request beside a
running batch takes a batch row's slot at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import openai
import pytest
from helpers.errors import assert_error
from helpers.sse import open_stream
from helpers.streams import endless

CHAT = "/v1/chat/completions"
BATCH_SECONDS = 120  # a test batch's whole run


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)


def chat_line(model, i: int, max_tokens: int = 12, **extra) -> dict:
    return {
        "custom_id": f"line-{i}",
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": str(model),
            "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        },
    }


def no_end(model) -> dict:
    """A logit_bias that forbids the end of turn: a line that runs to its max_tokens."""
    return endless(model)["logit_bias"]


def jsonl(lines: list) -> bytes:
    return b"".join(
        (json.dumps(x) if not isinstance(x, str) else x).encode() + b"\n" for x in lines
    )


def submit(sdk: openai.OpenAI, lines: list, endpoint: str = CHAT, **extra):
    uploaded = sdk.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return sdk.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h", **extra
    )


def until(condition, pause: float = 0.05):
    """Poll `condition` until it gives something true (returned), within BATCH_SECONDS."""
    deadline = time.monotonic() + BATCH_SECONDS
    while not (value := condition()):
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(pause)
    return value


def wait_ended(sdk: openai.OpenAI, batch_id: str):
    ended = ("completed", "failed", "cancelled", "expired")
    return until(lambda: (b := sdk.batches.retrieve(batch_id)).status in ended and b, 0.2)


def long_lines(model, count: int, max_tokens: int) -> list[dict]:
    """Lines that each run to their max_tokens."""
    return [
        chat_line(model, i, max_tokens=max_tokens, logit_bias=no_end(model)) for i in range(count)
    ]


def entries(sdk: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in sdk.files.content(file_id).text.splitlines()]


def alone(srv, body: dict) -> dict:
    status, _, reply = srv.post(CHAT, body)
    assert status == 200, reply
    return reply


@pytest.fixture(scope="module")
def batched(launch_module, tiny_model, embed_bert_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batches")
    return launch_module(
        tiny_model,
        *("--model", str(embed_bert_model)),
        *("--batch-db", str(folder / "batches.sqlite"), "--max-concurrent", "4"),
        *("--max-batch-lines", "20", "--max-batch-file-bytes", "65536"),
    )


def test_openai_sdk_batch_end_to_end(batched, tiny_model):
    """files.create, batches.create, retrieve until completed, files.content: every
    line's reply is the one the request gets alone; counts, usage and metadata add up."""
    sdk = client(batched)
    lines = [chat_line(tiny_model, i) for i in range(6)]
    batch = submit(sdk, lines, metadata={"run": "nightly"})
    assert batch.status == "in_progress" and batch.in_progress_at is not None
    assert batch.request_counts.total == 6 and batch.metadata == {"run": "nightly"}
    assert batch.completion_window == "24h" and batch.expires_at == batch.created_at + 86400
    done = wait_ended(sdk, batch.id)
    assert done.status == "completed" and done.error_file_id is None and done.errors is None
    assert done.request_counts.completed == 6 and done.request_counts.failed == 0
    assert done.finalizing_at is not None and done.completed_at is not None
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == [f"line-{i}" for i in range(6)]
    prompt = completion = 0
    for entry, line in zip(output, lines, strict=True):
        assert set(entry) == {"id", "custom_id", "response", "error"} and entry["error"] is None
        assert entry["id"].startswith("batch_req_")
        response = entry["response"]
        assert response["status_code"] == 200 and response["request_id"] == entry["id"]
        expected = alone(batched, line["body"])
        assert response["body"]["choices"] == expected["choices"]
        assert response["body"]["object"] == "chat.completion"
        prompt += response["body"]["usage"]["prompt_tokens"]
        completion += response["body"]["usage"]["completion_tokens"]
    assert done.usage.input_tokens == prompt and done.usage.output_tokens == completion
    output_file = sdk.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.filename.endswith("_output.jsonl")
    listed = sdk.batches.list(limit=1)
    assert [b.id for b in listed.data] == [batch.id]


@pytest.mark.parametrize(
    "endpoint, body",
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}),
        ("/v1/responses", {"input": "What is 2 plus 2?", "max_output_tokens": 8}),
        ("/v1/embeddings", {"input": ["a lemon", "a boat"]}),
    ],
)
def test_each_batch_endpoint_answers_as_alone(request, batched, endpoint, body):
    """Completions, Responses and embeddings lines: each reply is the endpoint's own for
    the request sent alone (ids and times aside)."""
    model = request.getfixturevalue("embed_bert_model" if "embed" in endpoint else "tiny_model")
    body = {**body, "model": str(model)}
    line = {"custom_id": "only", "method": "POST", "url": endpoint, "body": body}
    sdk = client(batched)
    done = wait_ended(sdk, submit(sdk, [line], endpoint=endpoint).id)
    (entry,) = entries(sdk, done.output_file_id)
    got = entry["response"]["body"]
    status, _, want = batched.post(endpoint, body)
    assert status == 200 and entry["response"]["status_code"] == 200
    # the request sent alone after the line finds its prompt in the prompt cache
    volatile = {"id", "created", "created_at", "completed_at", "output", "usage"}
    assert {k: v for k, v in got.items() if k not in volatile} == {
        k: v for k, v in want.items() if k not in volatile
    }
    if endpoint == "/v1/responses":
        assert [item["content"] for item in got["output"] if item["type"] == "message"] == [
            item["content"] for item in want["output"] if item["type"] == "message"
        ]
    counts = ("prompt_tokens", "input_tokens", "completion_tokens", "output_tokens")
    assert {k: got["usage"].get(k) for k in counts} == {k: want["usage"].get(k) for k in counts}
    assert done.usage.input_tokens == got["usage"].get(
        "prompt_tokens", got["usage"].get("input_tokens")
    )


def test_files_upload_list_retrieve_delete(batched):
    sdk = client(batched)
    data = jsonl([{"custom_id": "a"}])
    first = sdk.files.create(file=("one.jsonl", data), purpose="batch")
    second = sdk.files.create(file=("two.jsonl", data), purpose="batch")
    assert (first.object, first.bytes, first.filename, first.status) == (
        "file",
        len(data),
        "one.jsonl",
        "processed",
    )
    assert sdk.files.content(first.id).content == data
    assert sdk.files.retrieve(second.id).filename == "two.jsonl"
    ids = [f.id for f in sdk.files.list(purpose="batch").data]
    assert ids.index(second.id) < ids.index(first.id)  # newest first
    ascending = [f.id for f in sdk.files.list(purpose="batch", order="asc").data]
    assert ascending.index(first.id) < ascending.index(second.id)
    deleted = sdk.files.delete(first.id)
    assert deleted.deleted and deleted.id == first.id
    assert first.id not in [f.id for f in sdk.files.list().data]
    assert_error(batched.get(f"/v1/files/{first.id}"), 404, param="id", code="file_not_found")
    assert_error(batched.delete(f"/v1/files/{first.id}"), 404, param="id", code="file_not_found")


def test_lines_that_cannot_run_go_to_the_error_file(batched, tiny_model):
    """A line with its own custom_id that asks for what the batch does not serve, or that
    its endpoint refuses, is answered in the error file; the others run."""
    sdk = client(batched)
    good = chat_line(tiny_model, 1)
    lines = [
        good,
        {**chat_line(tiny_model, 2), "url": "/v1/embeddings"},
        {**chat_line(tiny_model, 3), "method": "GET"},
        {**chat_line(tiny_model, 4), "body": ["not", "an", "object"]},
        {**chat_line(tiny_model, 5), "body": {"model": str(tiny_model), "messages": "hi"}},
        {
            **chat_line(tiny_model, 6),
            "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        },
        chat_line(tiny_model, 7, stream=True),  # answered whole
    ]
    done = wait_ended(sdk, submit(sdk, lines).id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 5)
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == ["line-1", "line-7"]
    assert output[1]["response"]["body"]["object"] == "chat.completion"
    errors = {e["custom_id"]: e for e in entries(sdk, done.error_file_id)}
    assert list(errors) == ["line-2", "line-3", "line-4", "line-5", "line-6"]
    for custom_id, code in [("line-2", "mismatched_endpoint"), ("line-3", "invalid_method")]:
        assert errors[custom_id]["response"] is None
        assert errors[custom_id]["error"]["code"] == code
    assert errors["line-4"]["error"]["code"] == "invalid_body"
    refused = errors["line-5"]["response"]
    assert refused["status_code"] == 400 and errors["line-5"]["error"] is None
    assert refused["body"]["error"]["param"] == "messages"
    unknown = errors["line-6"]["response"]
    assert unknown["status_code"] == 404
    assert unknown["body"]["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "content, code, line",
    [
        (b"\n\n", "empty_file", None),
        (
            b'{"custom_id": "a", "method": "POST", "url": "'
            + CHAT.encode()
            + b'", "body": {}}\nnot json\n',
            "invalid_json_line",
            2,
        ),
        (jsonl([{"method": "POST", "url": CHAT, "body": {}}]), "missing_required_parameter", 1),
        (
            jsonl([{"custom_id": "a", "body": {}}, {"custom_id": "a", "body": {}}]),
            "duplicate_custom_id",
            2,
        ),
        (jsonl([{"custom_id": f"c{i}"} for i in range(21)]), "too_many_requests", None),
    ],
)
def test_a_file_that_cannot_be_split_into_requests_fails_the_batch(batched, content, code, line):
    sdk = client(batched)
    uploaded = sdk.files.create(file=("input.jsonl", content), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == code and batch.errors.data[0].line == line
    assert batch.output_file_id is None and batch.error_file_id is None


def test_refused_requests(batched):
    """Bad input is a 4xx in OpenAI's shape, and nothing is made."""
    sdk = client(batched)
    uploaded = sdk.files.create(file=("input.jsonl", b"{}\n"), purpose="batch")
    create = {"input_file_id": uploaded.id, "endpoint": CHAT, "completion_window": "24h"}
    before = len(sdk.batches.list(limit=100).data)
    cases = [
        ({**create, "input_file_id": "file-nope"}, 404, "input_file_id"),
        ({**create, "endpoint": "/v1/moderations"}, 400, "endpoint"),
        ({**create, "completion_window": "1h"}, 400, "completion_window"),
        ({**create, "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata"),
        ({"endpoint": CHAT, "completion_window": "24h"}, 400, "input_file_id"),
    ]
    for body, status, param in cases:
        assert_error(batched.post("/v1/batches", body), status, param=param)
    assert len(sdk.batches.list(limit=100).data) == before
    assert_error(batched.get("/v1/batches/batch_nope"), 404, param="id", code="batch_not_found")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.files.create(file=("input.jsonl", b"{}"), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"
    not_form = batched.post("/v1/files", {"purpose": "batch"})
    assert_error(not_form, 400)
    with pytest.raises(openai.APIStatusError) as too_large:
        sdk.files.create(file=("big.jsonl", b"x" * 200_000), purpose="batch")
    assert too_large.value.status_code == 413
    assert too_large.value.body["param"] == "file"
    assert_error(batched.get("/v1/batches?limit=0"), 400, param="limit")
    assert_error(batched.post("/v1/batches/x/nope", {}), 404, code="unknown_url")
    assert_error(batched.delete("/v1/batches"), 405, code="method_not_allowed")
    health = batched.get("/health")
    assert health[0] == 200


def test_cancel_ends_running_lines_and_reports_the_rest(batched, tiny_model):
    """Cancelled mid-run: the lines answered keep their replies, the rest are in the error
    file as batch_cancelled; each custom_id once."""
    sdk = client(batched)
    lines = long_lines(tiny_model, 12, max_tokens=200)
    batch = submit(sdk, lines)
    until(lambda: sdk.batches.retrieve(batch.id).request_counts.completed >= 1)
    cancelling = sdk.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_ended(sdk, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.cancelling_at is not None
    output = entries(sdk, done.output_file_id)
    errors = entries(sdk, done.error_file_id)
    ids = [e["custom_id"] for e in output + errors]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)
    assert 1 <= len(output) < 12
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert_error(batched.post(f"/v1/batches/{batch.id}/cancel", {}), 400, code="invalid_state")


def decoding_batch(launch, model, tmp_path, count: int, max_tokens: int, *flags: str):
    """A server with two decode slots, both held by rows of a batch of `count` long lines,
    one at least past mlx-lm's prompt stage (the status counts batch tokens): (server,
    SDK client, lines, batch)."""
    srv = launch(model, "--batch-db", str(tmp_path / "b.sqlite"), "--max-concurrent", "2", *flags)
    sdk = client(srv)
    lines = long_lines(model, count, max_tokens=max_tokens)
    batch = submit(sdk, lines)
    until(lambda: running(srv) >= 2, 0.01)
    until(lambda: srv.get("/v1/status")[2]["tokens_per_second"] > 0, 0.01)
    return srv, sdk, lines, batch


@pytest.mark.parametrize(
    "fixture, flags",
    [("tiny_model", ()), ("wide_heads_model", ("--kv-bits", "8", "--kv-group-size", "32"))],
    ids=["parked", "started-over"],
)
def test_batch_rows_pause_while_an_interactive_stream_runs(
    request, launch, tmp_path, fixture, flags
):
    """With every decode slot held by batch rows, an interactive stream starts at once and
    decodes alone: the batch rows pause (their caches kept) until it ends, then go on
    where they stopped; where a row's caches do not hold all its state (quantized KV
    caches here) it gives its slot up and starts over later. Each line's reply equals
    the request alone either way."""
    model = request.getfixturevalue(fixture)
    srv, sdk, lines, batch = decoding_batch(launch, model, tmp_path, 6, 400, *flags)
    body = {**endless(model, max_tokens=300), "temperature": 0}
    conn, response = open_stream(srv.url, CHAT, {**body, "stream": True})
    assert response.status == 200
    response.readline()  # its first event: the batch rows have paused
    assert running(srv) == 1
    assert srv.log_lines("2 batch rows pause while interactive work runs")
    chunks = [
        json.loads(line[6:])
        for raw in response
        if (line := raw.decode().strip()).startswith("data: {")
    ]
    conn.close()
    assert sdk.batches.retrieve(batch.id).status == "in_progress"  # the batch waited
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    whole = alone(srv, body)["choices"][0]["message"]
    assert streamed == whole["content"]
    done = wait_ended(sdk, batch.id)
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == [line["custom_id"] for line in lines]
    for entry, line in zip(output, lines, strict=True):
        assert entry["response"]["body"]["choices"] == alone(srv, line["body"])["choices"]
    pauses = srv.log_lines(" batch rows pause while interactive work runs", timeout=0)
    paused = sum(int(line.split(" batch rows pause")[0].rsplit(" ", 1)[1]) for line in pauses)
    started_over = len(srv.log_lines("gave its slot to an interactive request", timeout=0))
    if flags:
        assert started_over == paused
    else:  # rows past their prompt pause; one still in mlx-lm's prompt stage starts over
        assert started_over < paused


def test_paused_batch_rows_go_on_when_the_stream_beside_them_is_dropped(
    launch, tiny_model, tmp_path
):
    """A client that drops its stream (an editor cancelling) while batch rows are paused:
    the rows rejoin once the dropped row is gone, and every line's reply still equals the
    request alone."""
    srv, sdk, lines, batch = decoding_batch(launch, tiny_model, tmp_path, 2, 120)
    conn, response = open_stream(
        srv.url, CHAT, {**endless(tiny_model, max_tokens=2000), "stream": True}
    )
    for _ in range(4):
        response.readline()
    conn.close()
    done = wait_ended(sdk, batch.id)
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == [line["custom_id"] for line in lines]
    for entry, line in zip(output, lines, strict=True):
        assert entry["response"]["body"]["choices"] == alone(srv, line["body"])["choices"]
    assert srv.log_lines("2 batch rows pause while interactive work runs", timeout=0)


def test_a_batch_cancelled_while_its_rows_are_paused_ends_cleanly(launch, tiny_model, tmp_path):
    """Cancelled while an interactive stream holds the batch's paused rows aside: the
    paused lines end as batch_cancelled (each custom_id once), the stream is untouched,
    and nothing of the paused rows is left behind (a later request runs alone, exactly)."""
    srv, sdk, lines, batch = decoding_batch(launch, tiny_model, tmp_path, 4, 400)
    body = {**endless(tiny_model, max_tokens=200), "temperature": 0}
    conn, response = open_stream(srv.url, CHAT, {**body, "stream": True})
    response.readline()  # the batch rows have paused
    assert sdk.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    chunks = [
        json.loads(line[6:])
        for raw in response
        if (line := raw.decode().strip()).startswith("data: {")
    ]
    conn.close()
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == alone(srv, body)["choices"][0]["message"]["content"]
    done = wait_ended(sdk, batch.id)
    assert done.status == "cancelled"
    output, errors = entries(sdk, done.output_file_id), entries(sdk, done.error_file_id)
    ids = [e["custom_id"] for e in output + errors]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    until(lambda: running(srv) == 0)
    status = srv.get("/v1/status")[2]
    assert status["requests"] == {"running": 0, "waiting": 0}
    assert status["memory"]["kv_cache_bytes"] == 0, status["memory"]


def test_a_model_served_one_request_at_a_time_serves_interactive_first(
    launch, unbatched_model, tmp_path
):
    """A model served one request at a time (DeepSeek V4.1, whose caches do not batch):
    the batch line running gives way to an interactive request and runs again after it;
    each line's reply is the one it gets alone, the prompt cache on."""
    srv = launch(unbatched_model, "--batch-db", str(tmp_path / "b.sqlite"))
    assert srv.log_lines("one request at a time")
    sdk = client(srv)
    lines = long_lines(unbatched_model, 3, max_tokens=200)
    batch = submit(sdk, lines)
    until(lambda: running(srv) >= 1, 0.01)
    body = {"model": str(unbatched_model), "messages": [{"role": "user", "content": "Hi"}]}
    assert alone(srv, {**body, "max_tokens": 5})["choices"][0]["finish_reason"] == "length"
    assert srv.log_lines("gave its slot to an interactive request")
    done = wait_ended(sdk, batch.id)
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == [line["custom_id"] for line in lines]
    for entry, line in zip(output, lines, strict=True):
        assert entry["response"]["body"]["choices"] == alone(srv, line["body"])["choices"]


def running(srv) -> int:
    return srv.get("/v1/status")[2]["requests"]["running"]


def test_kill_9_mid_batch_then_restart_answers_every_line_once(launch, tiny_model, tmp_path):
    db = str(tmp_path / "batches.sqlite")
    first = launch(tiny_model, "--batch-db", db, "--max-concurrent", "2")
    sdk = client(first)
    lines = long_lines(tiny_model, 16, max_tokens=60)
    batch = submit(sdk, lines)
    until(lambda: sdk.batches.retrieve(batch.id).request_counts.completed >= 3, 0.02)
    first.process.kill()  # SIGKILL: nothing is flushed or closed
    first.process.wait()
    second = launch(tiny_model, "--batch-db", db, "--max-concurrent", "2")
    sdk = client(second)
    resumed = sdk.batches.retrieve(batch.id)
    assert 3 <= resumed.request_counts.completed < 16
    done = wait_ended(sdk, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 16
    output = entries(sdk, done.output_file_id)
    assert [e["custom_id"] for e in output] == [line["custom_id"] for line in lines]
    assert len({e["id"] for e in output}) == 16
    for entry, line in zip(output, lines, strict=True):
        assert entry["response"]["body"]["choices"] == alone(second, line["body"])["choices"]
    assert entries(sdk, done.error_file_id) == []


def test_a_second_server_on_the_same_store_refuses_batches(launch, batched, tiny_model):
    """One server owns a store: another given the same file says so (503), and serves
    everything else."""
    db = next(a for a in batched.process.args if str(a).endswith("batches.sqlite"))
    other = launch(tiny_model, "--batch-db", str(db))
    status, _, body = other.get("/v1/batches")
    assert status == 503 and "--batch-db" in body["error"]["message"]
    assert (
        other.post(CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0]
        == 200
    )


def anthropic_client(srv) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)


def message_params(model, i: int, max_tokens: int = 12) -> dict:
    return {
        "model": str(model),
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}],
    }


def test_anthropic_sdk_message_batches(batched, tiny_model):
    """messages.batches create, retrieve, list, results and delete; each result equals
    the message sent alone; an errored request is an errored result in Anthropic's
    shape."""
    sdk = anthropic_client(batched)
    requests = [{"custom_id": f"q{i}", "params": message_params(tiny_model, i)} for i in range(4)]
    requests.append({"custom_id": "broken", "params": {"model": str(tiny_model), "messages": []}})
    created = sdk.messages.batches.create(requests=requests)
    assert created.type == "message_batch" and created.id.startswith("msgbatch_")
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing + created.request_counts.succeeded == 5
    batch = until(
        lambda: (b := sdk.messages.batches.retrieve(created.id)).processing_status == "ended" and b,
        0.2,
    )
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (4, 1, 0)
    assert batch.ended_at is not None and batch.results_url.endswith(f"/{batch.id}/results")
    results = {r.custom_id: r.result for r in sdk.messages.batches.results(batch.id)}
    assert list(results) == [r["custom_id"] for r in requests]
    for i in range(4):
        expected = sdk.messages.create(**message_params(tiny_model, i))
        got = results[f"q{i}"]
        assert got.type == "succeeded"
        assert got.message.content == expected.content
        assert got.message.stop_reason == expected.stop_reason
    broken = results["broken"]
    assert broken.type == "errored" and broken.error.error.type == "invalid_request_error"
    assert batch.id in [b.id for b in sdk.messages.batches.list(limit=5).data]
    deleted = sdk.messages.batches.delete(batch.id)
    assert deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        sdk.messages.batches.retrieve(batch.id)


def test_anthropic_cancel_and_refusals(batched, tiny_model):
    sdk = anthropic_client(batched)
    requests = [
        {"custom_id": f"long{i}", "params": message_params(tiny_model, i, max_tokens=200)}
        for i in range(10)
    ]
    batch = sdk.messages.batches.create(requests=requests)
    status, _, early = batched.get(f"/v1/messages/batches/{batch.id}/results")  # not ended
    assert status == 400 and early["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.batches.delete(batch.id)
    canceling = sdk.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended")
    assert canceling.cancel_initiated_at is not None
    until(lambda: sdk.messages.batches.retrieve(batch.id).processing_status == "ended", 0.1)
    results = list(sdk.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
    assert {r.result.type for r in results} <= {"succeeded", "canceled"}
    assert any(r.result.type == "canceled" for r in results)
    duplicate = [{"custom_id": "same", "params": {}}, {"custom_id": "same", "params": {}}]
    for body in [
        {"requests": duplicate},
        {"requests": []},
        {"requests": [{"custom_id": "bad id!", "params": {}}]},
    ]:
        status, _, reply = batched.post("/v1/messages/batches", body)
        assert status == 400, reply
        assert reply["type"] == "error" and reply["error"]["type"] == "invalid_request_error"
    status, _, reply = batched.get("/v1/messages/batches/msgbatch_nope")
    assert status == 404 and reply["type"] == "error"


def test_the_store_survives_a_restart(launch, tiny_model, tmp_path: Path):
    """Files and ended batches are read back after a clean restart."""
    db = str(tmp_path / "b.sqlite")
    first = launch(tiny_model, "--batch-db", db)
    sdk = client(first)
    done = wait_ended(sdk, submit(sdk, [chat_line(tiny_model, 1)]).id)
    output = entries(sdk, done.output_file_id)
    first.stop()
    second = launch(tiny_model, "--batch-db", db)
    again = client(second).batches.retrieve(done.id)
    assert again.model_dump() == done.model_dump()
    assert entries(client(second), again.output_file_id) == output

"""What operators see: X-Request-Id on every response and in every log line of its request,
one access-log line per request, Prometheus metrics that add up to the replies' usage, and
vLLM's /tokenize and /detokenize."""

from __future__ import annotations

import re
import time

import pytest
from conversations import BY_NAME
from helpers.metrics import metrics
from helpers.server import start_server
from helpers.sse import open_stream, stream
from helpers.streams import concurrently, endless

CHAT = "/v1/chat/completions"
ID = re.compile(r"req_[0-9a-f]{24}")


@pytest.fixture(scope="module")
def fresh(tiny_model):
    """A server of its own: its counters start at zero."""
    srv = start_server(tiny_model)
    yield srv
    srv.stop()


def metrics_when(srv, condition, seconds: float = 5.0) -> dict:
    """The metrics once `condition(values)` holds: a request is counted just after its
    reply has gone out."""
    deadline = time.monotonic() + seconds
    while not condition(values := metrics(srv)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return values


def sample(values: dict, name: str, **labels) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def answered(values: dict) -> float:
    """Requests counted, scrapes of /metrics left out."""
    return sum(
        value
        for (name, labels), value in values.items()
        if name == "mlxserve_requests_total" and ("endpoint", "/metrics") not in labels
    )


def access_lines(srv, request_id: str) -> list[str]:
    return [line for line in srv.log if "mlxserve.access" in line and request_id in line]


def wait_for(condition, seconds: float = 5.0):
    deadline = time.monotonic() + seconds
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return result


def test_every_response_carries_a_request_id(fresh):
    _, headers, _ = fresh.post(CHAT, BY_NAME["capital"].request)
    first = headers["X-Request-Id"]
    assert ID.fullmatch(first)
    _, headers, _ = fresh.post(CHAT, BY_NAME["capital"].request)
    assert ID.fullmatch(headers["X-Request-Id"]) and headers["X-Request-Id"] != first
    for status, headers, _ in (
        fresh.get("/v1/nowhere"),
        fresh.post(CHAT, {"messages": "not a list"}),
        fresh.get("/health"),
    ):
        assert status in (200, 400, 404) and ID.fullmatch(headers["X-Request-Id"])
    result = stream(fresh.url, CHAT, {**BY_NAME["capital"].request, "stream": True})
    assert ID.fullmatch(result.headers["X-Request-Id"])


def test_the_clients_request_id_is_kept_when_it_is_plain(fresh):
    _, headers, _ = fresh.post(CHAT, BY_NAME["capital"].request, {"X-Request-Id": "trace-42.a:b"})
    assert headers["X-Request-Id"] == "trace-42.a:b"
    for unusable in ("has space", "x" * 129, "new\tline"):
        _, headers, _ = fresh.post(CHAT, BY_NAME["capital"].request, {"X-Request-Id": unusable})
        assert ID.fullmatch(headers["X-Request-Id"])


def test_one_access_line_per_request_with_tokens_and_speed(fresh):
    status, headers, reply = fresh.post(CHAT, BY_NAME["story"].request)
    assert status == 200
    usage = reply["usage"]
    lines = wait_for(lambda: access_lines(fresh, headers["X-Request-Id"]))
    assert len(lines) == 1
    line = lines[0]
    assert f"[{headers['X-Request-Id']}]" in line
    assert '"POST /v1/chat/completions" 200 model=' in line
    assert (
        f"prompt={usage['prompt_tokens']} "
        f"cached={usage['prompt_tokens_details']['cached_tokens']} "
        f"completion={usage['completion_tokens']}"
    ) in line
    assert re.search(r" ttft=\d+\.\d{3}s tok/s=\d+\.\d time=\d+\.\d{3}s$", line.rstrip())


def test_log_lines_written_while_answering_carry_the_id(fresh):
    _, headers, _ = fresh.post(CHAT, {"messages": [], "max_tokens": 5})
    request_id = headers["X-Request-Id"]
    lines = wait_for(lambda: [line for line in fresh.log if request_id in line])
    refusal = [line for line in lines if "mlxserve.api.handler" in line]
    assert refusal and "-> 400" in refusal[0] and f"[{request_id}]" in refusal[0]


def test_metrics_add_up_to_the_usage_of_the_replies(tiny_model):
    srv = start_server(tiny_model)
    try:
        totals = {"prompt": 0, "cached": 0, "completion": 0}
        for name in ("capital", "story", "capital"):
            _, _, reply = srv.post(CHAT, BY_NAME[name].request)
            usage = reply["usage"]
            totals["prompt"] += usage["prompt_tokens"]
            totals["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
            totals["completion"] += usage["completion_tokens"]
        assert totals["cached"] > 0  # the second "capital" came from the prompt cache
        srv.post(CHAT, {"messages": "bad"})
        srv.get("/v1/no/such/path")
        values = metrics_when(srv, lambda v: answered(v) == 5)
        model = next(
            dict(labels)["model"]
            for (name, labels) in values
            if name == "mlxserve_model_memory_bytes"
        )
        ok = {"model": model, "endpoint": CHAT, "status": "200"}
        assert sample(values, "mlxserve_requests_total", **ok) == 3
        # a body that fails validation names no model yet
        assert sample(values, "mlxserve_requests_total", model="", endpoint=CHAT, status="400") == 1
        assert (
            sample(values, "mlxserve_requests_total", model="", endpoint="other", status="404") == 1
        )
        assert sample(values, "mlxserve_prompt_tokens_total", model=model) == totals["prompt"]
        assert (
            sample(values, "mlxserve_prompt_cache_hit_tokens_total", model=model)
            == totals["cached"]
        )
        assert (
            sample(values, "mlxserve_generation_tokens_total", model=model) == totals["completion"]
        )
        for histogram in ("time_to_first_token", "e2e_request_latency"):
            assert sample(values, f"mlxserve_{histogram}_seconds_count", model=model) == 3
        gaps = totals["completion"] - 3  # one gap fewer than tokens, per reply
        assert sample(values, "mlxserve_inter_token_latency_seconds_count", model=model) == gaps
        assert sample(values, "mlxserve_model_memory_bytes", model=model) > 100_000
        assert sample(values, "mlxserve_prompt_cache_bytes") > 0
        assert sample(values, "process_resident_memory_bytes") > 0
        assert sample(values, "mlxserve_mlx_active_memory_bytes") > 0
        assert ("mlxserve_mlx_cache_memory_bytes", ()) in values
    finally:
        srv.stop()


def test_running_and_waiting_gauges_follow_the_work(agent_model):
    srv = start_server(agent_model, "--max-concurrent", "1")
    try:
        body = {**endless(agent_model, max_tokens=130_000), "stream": True}
        conn, response = open_stream(srv.url, CHAT, body)
        response.readline()  # generation has begun
        second, _ = open_stream(srv.url, CHAT, body)
        values = metrics_when(srv, lambda v: sample(v, "mlxserve_requests_waiting") == 1)
        assert sample(values, "mlxserve_requests_running") == 1
        assert sample(values, "mlxserve_requests_waiting") == 1
        conn.close()
        second.close()
        values = metrics_when(srv, lambda v: sample(v, "mlxserve_requests_running") == 0)
        assert sample(values, "mlxserve_requests_waiting") == 0
    finally:
        srv.stop()


def test_metrics_need_the_api_key_when_one_is_set(launch, tiny_model):
    srv = launch(tiny_model, "--api-key", "sekrit")
    assert srv.get("/metrics")[0] == 401
    status, _, text = srv.get("/metrics", {"Authorization": "Bearer sekrit"})
    assert status == 200 and "mlxserve_requests_total" in text


def test_tokenize_a_chat_exactly_as_it_is_rendered(fresh):
    body = {**BY_NAME["tool_call"].request, "max_tokens": 5}
    _, _, reply = fresh.post(CHAT, body)
    status, _, tokens = fresh.post("/tokenize", {**body, "return_token_strs": True})
    assert status == 200, tokens
    assert tokens["count"] == len(tokens["tokens"]) == reply["usage"]["prompt_tokens"]
    assert tokens["max_model_len"] == 4096
    assert len(tokens["token_strs"]) == tokens["count"]
    assert tokens["token_strs"][0] == "<|im_start|>"
    status, _, text = fresh.post("/detokenize", {"tokens": tokens["tokens"]})
    assert status == 200
    assert text["prompt"].startswith("<|im_start|>") and "get_weather" in text["prompt"]
    assert text["prompt"].endswith("<|im_start|>assistant\n")


def test_tokenize_text_and_back(fresh):
    status, _, tokens = fresh.post("/v1/tokenize", {"prompt": "The capital of France"})
    assert status == 200 and set(tokens) == {"count", "max_model_len", "tokens"}
    status, _, text = fresh.post("/v1/detokenize", {"tokens": tokens["tokens"]})
    assert text == {"prompt": "The capital of France"}


def test_max_model_len_follows_max_context(launch, tiny_model):
    srv = launch(tiny_model, "--max-context", "1000")
    _, _, tokens = srv.post("/tokenize", {"prompt": "hi"})
    assert tokens["max_model_len"] == 1000


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": "hi"}, 400, "messages"),
        ("/tokenize", {"prompt": "hi", "model": "no-such-model"}, 404, "model"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {"tokens": "12"}, 400, "tokens"),
    ],
)
def test_tokenize_mistakes_are_client_errors(fresh, path, body, status, param):
    code, _, reply = fresh.post(path, body)
    assert code == status, reply
    assert reply["error"]["param"] == param


def test_the_prompt_cache_holds_the_memory_it_reports(tiny_model):
    """Entries sliced out of a batch used to keep the whole batch's buffers alive until
    they were computed: MLX held several times the bytes the prompt cache counted."""
    srv = start_server(tiny_model)
    try:
        base = sample(metrics(srv), "mlxserve_mlx_active_memory_bytes")
        bodies = [
            {
                "messages": [{"role": "user", "content": f"Story {i}: " + "lemon tree " * 40 * i}],
                "max_tokens": 60,
            }
            for i in range(1, 9)
        ]
        concurrently(lambda body: srv.post(CHAT, body), bodies)
        values = metrics_when(srv, lambda v: answered(v) == 8)
        held = sample(values, "mlxserve_mlx_active_memory_bytes") - base
        cached = sample(values, "mlxserve_prompt_cache_bytes")
        assert cached > 0
        assert held <= 1.1 * cached + 64 * 1024, (held, cached)
    finally:
        srv.stop()

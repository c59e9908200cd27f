"""GET /openapi.json: a valid OpenAPI 3.1 document of every route the server answers (it is
built from the route table: test_route_table.py), each operation answered by the real
server, fuzzed by schemathesis against a real server on a fixture model: no 5xx, no hang,
replies in their documented shapes and content types, and the server's memory back near
where it started."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from openapi_spec_validator import validate

FUZZ_SECONDS = 240  # the fuzz run's whole budget (it stops itself well before)
# What the run may grow the server by: caches the fuzzing fills (the prompt cache, stored
# responses) within their bounds, and the allocator's slack. A leak per request grows past
# it within the run's thousands of requests.
MEMORY_SLACK = 64 * 2**20  # measured: 16 MiB over 121 s on this CPU


def test_every_operation_is_answered_and_the_document_validates(server):
    status, headers, body = server.get("/openapi.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    validate(body)  # openapi-spec-validator: a valid OpenAPI 3.1 document
    assert body["openapi"] == "3.1.0"
    for path, methods in body["paths"].items():
        for method, operation in methods.items():
            assert operation["responses"]["200"]["content"], (method, path)
            if method == "post":
                assert operation["requestBody"]["content"], (method, path)
            url = path.replace("{", "").replace("}", "")  # placeholder ids
            sent = server.post(url, b"{}") if method == "post" else _call(server, method, url)
            error = sent[2].get("error") if isinstance(sent[2], dict) else None
            if isinstance(error, str):  # Ollama's errors are a message alone
                assert not error.startswith(("Unknown path", "Method ")), (method, path, error)
                continue
            code = (error or {}).get("code")
            assert code not in ("unknown_url", "method_not_allowed"), (method, path, sent[2])


def _call(server, method: str, url: str):
    return server.delete(url) if method == "delete" else server.get(url)


def test_openapi_json_needs_no_key(launch, tiny_model):
    srv = launch(tiny_model, "--api-key", "secret")
    assert srv.get("/openapi.json")[0] == 200
    assert srv.get("/v1/models")[0] == 401


@pytest.mark.timeout(FUZZ_SECONDS + 120)
def test_schemathesis_finds_no_server_error(launch, tiny_model, embed_bert_model, tmp_path):
    srv = launch(
        tiny_model,
        *("--model", str(embed_bert_model), "--max-context", "128"),
        *("--batch-db", str(tmp_path / "batches.sqlite")),
        *("--model-names-db", str(tmp_path / "names.sqlite")),
    )
    process = psutil.Process(srv.process.pid)
    for _ in range(3):  # warm: the models, the compiled steps, the first allocations
        srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    baseline = process.memory_info().rss
    command = [
        str(Path(sys.executable).with_name("st")),
        *("run", f"{srv.url}/openapi.json"),
        *("--checks", "not_a_server_error,status_code_conformance,"),
        "content_type_conformance,response_schema_conformance",
    ]
    command[4] += command.pop(5)  # one comma-separated list
    command += [
        *("--max-examples", "5", "--seed", "1", "--workers", "1"),
        *("--request-timeout", "60", "--max-time", str(FUZZ_SECONDS // 2)),
        "--suppress-health-check=filter_too_much",  # ids in paths: few strings are usable
        "--no-color",
    ]
    started = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=FUZZ_SECONDS, cwd=tmp_path
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-20_000:]
    assert srv.process.poll() is None  # still up
    assert srv.get("/health")[0] == 200
    grown = process.memory_info().rss - baseline
    assert grown < MEMORY_SLACK, f"grew {grown / 2**20:.0f} MiB over {took:.0f} s of fuzzing"


# What the fuzzing found, each pinned by a test of its own ------------------------------


@pytest.mark.parametrize("method", ["PUT", "PATCH", "TRACE", "HEAD"])
def test_other_methods_are_405_in_json(server, method):
    conn = http.client.HTTPConnection(*server.url.removeprefix("http://").split(":"))
    conn.request(method, "/v1/chat/completions")
    response = conn.getresponse()
    body = response.read()
    assert response.status == 405 and response.getheader("Content-Type") == "application/json"
    if method == "HEAD":
        assert body == b""  # HEAD answers headers only
    else:
        assert json.loads(body)["error"]["code"] == "method_not_allowed"
    conn.close()


@pytest.mark.parametrize("method", ["GET", "DELETE", "OPTIONS"])
def test_a_body_nobody_reads_is_not_the_next_request(server, method):
    """A GET's (or a DELETE's, a preflight's) body is read and dropped: the next request
    on the same connection is answered as itself."""
    conn = http.client.HTTPConnection(*server.url.removeprefix("http://").split(":"))
    conn.request(method, "/v1/models", json.dumps({"model": "x", "input": ""}))
    conn.getresponse().read()
    conn.request("POST", "/tokenize", json.dumps({"prompt": "Hi"}))
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["count"] >= 1
    conn.close()


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages/count_tokens", {"model": "default", "messages": [{"role": "user", "content": []}]}, "messages"),
        ("/v1/responses", {"input": [None]}, "input[0]"),
        ("/v1/responses", {"input": [{"type": {}}]}, "input[0]"),
        ("/v1/adapters/load", {"name": "a", "path": "\u0000x"}, "path"),
        ("/v1/messages", {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "context_management": {"edits": [{"type": {}}]}}, "context_management.edits"),
    ],
)  # fmt: skip
def test_malformed_bodies_are_400_naming_the_field(server, path, body, param):
    status, _, reply = server.post(path, body)
    assert status == 400, reply
    error = reply["error"]
    assert error.get("param", param) == param and param in (error.get("param") or error["message"])


def test_a_signature_that_is_not_ascii_is_just_not_ours(server):
    """A thinking block's signature, or an encrypted_content tag, with characters hmac
    refuses to compare: the block is left out (not ours), not a 500."""
    turns = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "\u00e9t\u00e9"},
                {"type": "text", "text": "Hello"},
            ],
        },
        {"role": "user", "content": "Again"},
    ]
    status, _, reply = server.post(
        "/v1/messages", {"model": "default", "max_tokens": 2, "messages": turns}
    )
    assert status == 200, reply
    item = {"type": "reasoning", "summary": [], "encrypted_content": "mlxserve-rs1.x\u00e9.\u00e9"}
    status, _, reply = server.post(
        "/v1/responses",
        {"input": [{"role": "user", "content": "Hi"}, item], "max_output_tokens": 2},
    )
    assert status == 200, reply

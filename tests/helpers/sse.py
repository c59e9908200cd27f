"""A raw SSE client for tests: every line as sent, so the wire format itself is checked."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class Stream:
    status: int
    headers: dict
    lines: list[str]  # every non-empty line, comments included

    @property
    def data(self) -> list[str]:
        return [line[len("data: ") :] for line in self.lines if line.startswith("data: ")]

    @property
    def chunks(self) -> list[dict]:
        """Every data payload but [DONE], each of which must be one JSON object."""
        return [json.loads(d) for d in self.data if d != "[DONE]"]

    @property
    def comments(self) -> list[str]:
        return [line for line in self.lines if line.startswith(":")]


def open_stream(url: str, path: str, body: dict, headers: dict | None = None, timeout=120):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    conn.request(
        "POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
    )
    return conn, conn.getresponse()


def stream(url: str, path: str, body: dict, headers: dict | None = None) -> Stream:
    conn, response = open_stream(url, path, {**body, "stream": True}, headers)
    try:
        raw = response.read().decode("utf-8")
    finally:
        conn.close()
    lines = [line for line in raw.split("\n") if line]
    return Stream(response.status, dict(response.getheaders()), lines)


def logprob_entries(chunks: list[dict]) -> list[dict]:
    """The logprob entries of a streamed chat reply's first choice, in order."""
    return [
        e
        for c in chunks
        if c["choices"]
        for e in (c["choices"][0].get("logprobs") or {}).get("content") or []
    ]


def chat_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def chat_message(chunks: list[dict], index: int = 0) -> dict:
    """Reassemble the assistant message of choice `index` from streamed deltas, checking
    the tool-call delta protocol on the way (tool call ids left out, as in
    Conversation.message)."""
    message: dict = {"role": "assistant", "content": ""}
    reasoning = ""
    calls: list[dict] = []
    for chunk in chunks:
        if not chunk["choices"] or chunk["choices"][0]["index"] != index:
            continue
        delta = chunk["choices"][0]["delta"]
        message["content"] += delta.get("content") or ""
        assert delta.get("reasoning_content") == delta.get("reasoning")
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls", []):
            if call["index"] == len(calls):  # the first delta of a call
                assert call["id"].startswith("call_") and call["type"] == "function"
                assert call["function"]["arguments"] == ""
                calls.append({"type": "function", "function": dict(call["function"])})
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    if calls:
        message["tool_calls"] = calls
        message["content"] = message["content"] or None
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning
    return message


def without_call_ids(message: dict) -> dict:
    calls = message.get("tool_calls")
    if not calls:
        return message
    for call in calls:
        assert call.pop("id").startswith("call_")
    return message


def named_events(result: Stream) -> list[tuple[str, dict]]:
    """(event name, payload) of a stream of typed events (Anthropic's), checking that
    each `data:` line follows its own `event:` line and names the same type."""
    events = []
    lines = [line for line in result.lines if not line.startswith(":")]
    assert len(lines) % 2 == 0, lines
    for name_line, data_line in zip(lines[::2], lines[1::2], strict=True):
        assert name_line.startswith("event: ") and data_line.startswith("data: "), lines
        name, payload = name_line[len("event: ") :], json.loads(data_line[len("data: ") :])
        assert payload["type"] == name
        events.append((name, payload))
    return events

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


def chat_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])

"""Requests that keep a batch busy, and what the batching tests compare."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conversations import BY_NAME
from transformers import AutoTokenizer

from helpers.server import CHAT
from helpers.sse import chat_message, chat_text, logprob_entries, open_stream, stream


def endless(model, ends=("<|im_end|>",), **extra) -> dict:
    """A request that never ends by itself: the end-of-turn tokens are forbidden."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    bias = {str(tokenizer.convert_tokens_to_ids(end)): -100 for end in ends}
    return {"messages": BY_NAME["story"].messages, "logit_bias": bias, **extra}


def tokens_and_message(server, body: dict, streamed: bool) -> tuple[list[str], dict]:
    """The generated tokens (from logprobs) and the assistant message, tool ids left out."""
    body = {**body, "logprobs": True}
    if streamed:
        result = stream(server.url, CHAT, body)
        assert result.status == 200, result.lines
        entries = logprob_entries(result.chunks)
        message = chat_message(result.chunks)
    else:
        status, _, reply = server.post(CHAT, body)
        assert status == 200, reply
        entries = reply["choices"][0]["logprobs"]["content"]
        message = reply["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            del call["id"]
    message.pop("refusal", None)
    return [e["token"] for e in entries], message


def concurrently(fn, items) -> list:
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


# Tokens that would end a reply, per fixture model.
ENDS = {
    "tiny_model": ("<|im_end|>",),
    "wide_heads_model": ("<|im_end|>",),
    "harmony_model": ("<|return|>", "<|call|>", "<|endoftext|>"),
    "chunked_model": ("<|im_end|>",),  # test_batching's Llama 4 test
    "vision_model": ("<|im_end|>",),
    "qwen35_vision_model": ("<|im_end|>",),
    "gemma3_vision_model": ("<end_of_turn>",),
    "qwen3_vl_model": ("<|im_end|>",),
    "mistral3_vision_model": ("</s>",),
    "gemma4_vision_model": ("<end_of_turn>",),
    "qwen3_vl_moe_model": ("<|im_end|>",),
    "llama4_vision_model": ("<|eot|>",),
}


def endless_stream(srv, model, ends):
    """A stream that keeps the batch busy until it is closed."""
    body = {**endless(model, ends, max_tokens=4000), "stream": True}
    conn, response = open_stream(srv.url, CHAT, body)
    assert response.status == 200
    response.readline()  # the stream has started: the batch is running
    return conn


def beside_a_stream(srv, model, ends, fn, items) -> list:
    """`fn` over `items` all at once while an endless stream runs: each joins a running
    batch."""
    background = endless_stream(srv, model, ends)
    try:
        return concurrently(fn, items)
    finally:
        background.close()


class TimedStream:
    """Reads an SSE response in a thread and keeps when each line arrived. Starting one
    waits for the response headers: the first event or keepalive comment."""

    def __init__(self, srv, body: dict):
        self.conn, response = open_stream(srv.url, CHAT, {**body, "stream": True})
        assert response.status == 200
        self.lines: list[tuple[float, str]] = []
        self._response = response
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while line := self._response.readline():
                if line.strip():
                    self.lines.append((time.monotonic(), line.decode().strip()))
        except (OSError, AttributeError):  # close() shut the connection under the reader
            pass

    def data_times(self) -> list[float]:
        return [t for t, line in self.lines if line.startswith("data: {")]

    def text(self) -> str:
        chunks = [json.loads(line[6:]) for _, line in self.lines if line.startswith("data: {")]
        return chat_text(chunks)

    def first_data(self) -> float:
        return self.data_times()[0]

    def wait(self, timeout: float = 120) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"

    def close(self) -> None:
        """Hang up now (closing alone would wait for the reader's next line)."""
        self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()

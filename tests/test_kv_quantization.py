"""A KV cache quantized to 4 or 8 bits (--kv-bits): trained replies unchanged, the prompt
cache and its disk tier reused, less memory per token; batched == alone is checked with
the other batching tests."""

from __future__ import annotations

import pytest
from conversations import BY_NAME, CONVERSATIONS
from helpers.checks import assert_round_trip
from helpers.server import start_server
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"
GROUP = 32  # the wide-heads fixture's heads have 32 dimensions
HEAD_DIM = 32


def quantized(bits: int) -> tuple[str, ...]:
    return ("--kv-bits", str(bits), "--kv-group-size", str(GROUP))


@pytest.fixture(scope="module", params=[4, 8])
def kv_server(request, wide_heads_model):
    srv = start_server(wide_heads_model, *quantized(request.param))
    yield srv
    srv.stop()


@pytest.mark.parametrize("conv", CONVERSATIONS, ids=lambda c: c.name)
def test_every_trained_reply_is_exact(kv_server, conv):
    assert_round_trip(kv_server, conv, markup=("<think>", "</think>", "<tool_call>"))


def test_the_prompt_cache_is_reused(kv_server):
    first = kv_server.post(CHAT, BY_NAME["story"].request)[2]
    second = kv_server.post(CHAT, BY_NAME["story"].request)[2]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["choices"][0]["message"] == first["choices"][0]["message"]


def prompt_cache_bytes(srv) -> float:
    text = srv.get("/metrics")[2]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families["mlxserve_prompt_cache_bytes"].samples[0].value


@pytest.mark.parametrize("bits", [4, 8])
def test_a_token_takes_what_its_bits_say(launch, wide_heads_model, bits):
    """float32 keys and values of 32 dimensions (128 bytes) against `bits` each plus a
    float32 scale and bias per group of 32."""
    plain = launch(wide_heads_model)
    small = launch(wide_heads_model, *quantized(bits))
    for srv in (plain, small):
        srv.post(CHAT, BY_NAME["story"].request)
    expected = (HEAD_DIM * 4) / (HEAD_DIM * bits / 8 + 2 * 4 * HEAD_DIM / GROUP)
    assert prompt_cache_bytes(plain) / prompt_cache_bytes(small) == pytest.approx(expected)


def test_the_disk_tier_keeps_quantized_caches_apart(tmp_path, wide_heads_model):
    """A restarted server reuses what it wrote; a server with another KV layout never
    loads those files (they would not merge into its batch)."""
    body = BY_NAME["story"].request
    writer = start_server(wide_heads_model, *quantized(4), "--prompt-cache-dir", str(tmp_path))
    expected = writer.post(CHAT, body)[2]["choices"][0]["message"]
    writer.stop()  # SIGTERM: the memory tier is written to disk
    writer.process.wait(timeout=30)
    assert list(tmp_path.glob("*.safetensors"))
    for flags, reused in ((quantized(4), True), ((), False), (quantized(8), False)):
        srv = start_server(wide_heads_model, *flags, "--prompt-cache-dir", str(tmp_path))
        try:
            status, _, reply = srv.post(CHAT, body)
        finally:
            srv.stop()
        assert status == 200, reply
        assert (reply["usage"]["prompt_tokens_details"]["cached_tokens"] > 0) is reused
        assert reply["choices"][0]["message"] == expected


def test_a_head_the_groups_do_not_divide_is_a_clear_start_up_error(tiny_model):
    """tiny-chat's heads have 16 dimensions: groups of 64 cannot split them."""
    with pytest.raises(RuntimeError) as error:
        start_server(tiny_model, "--kv-bits", "4")
    assert "cannot be quantized with --kv-bits 4 --kv-group-size 64" in str(error.value)

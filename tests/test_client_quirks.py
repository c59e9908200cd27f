"""What clients send as they ship (api/quirks.py): Claude Code's per-session billing line
does not defeat the prompt cache, and hosted tools (Codex's web search, Anthropic's server
tools) are left out of the prompt instead of failing the request."""

from __future__ import annotations

import anthropic
from conversations import WEATHER_TOOL
from helpers.tools import WEATHER

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
# ~250 tokens of instructions, as Claude Code's system prompt follows its billing line
SYSTEM = "You are an agent that helps with software. " * 25


def billing_line(session: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.330.{session}; cc_entrypoint=cli; cch={session};"


def usage_of(server, system, question: str) -> dict:
    status, _, body = server.post(
        MESSAGES,
        {
            "model": "default",
            "max_tokens": 4,
            "system": system,
            "messages": [{"role": "user", "content": question}],
        },
    )
    assert status == 200, body
    return body["usage"]


def test_claude_codes_billing_line_is_left_out(server):
    """As its own first system block (how Claude Code sends it) or as the first line of
    the system text: the prompt is the one without it, so a new session (a new hash)
    continues from the previous session's prompt cache."""
    plain = usage_of(server, SYSTEM, "First question?")
    prompt = plain["input_tokens"] + plain["cache_read_input_tokens"]
    for i, session in enumerate(["a1b2c", "d3e4f"]):
        blocks = [
            {"type": "text", "text": billing_line(session)},
            {"type": "text", "text": SYSTEM},
        ]
        usage = usage_of(server, blocks, "First question?")
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == prompt
        assert usage["cache_read_input_tokens"] >= prompt - 1, (i, usage)
    usage = usage_of(server, billing_line("9z9z9") + "\n" + SYSTEM, "First question?")
    assert usage["cache_read_input_tokens"] >= prompt - 1, usage
    sdk = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    counted = sdk.messages.count_tokens(
        model="default",
        system=[{"type": "text", "text": billing_line("q")}, {"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": "First question?"}],
    )
    assert counted.input_tokens == prompt


def test_anthropic_server_tools_are_left_out(server):
    request = {
        "model": "default",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    }
    server_tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "code_execution_20250522", "name": "code_execution"},
    ]
    _, _, alone = server.post(MESSAGES, {**request, "tools": [WEATHER]})
    status, _, body = server.post(MESSAGES, {**request, "tools": [*server_tools, WEATHER]})
    assert status == 200, body
    assert body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"] == (
        alone["usage"]["input_tokens"] + alone["usage"]["cache_read_input_tokens"]
    )
    warnings = [line for line in server.log if "hosted tools this server cannot run" in line]
    for kind in ("code_execution_20250522", "web_search_20250305"):  # once, by any request
        assert len([line for line in warnings if kind in line]) == 1, warnings


def test_responses_hosted_tools_are_left_out(server):
    """Codex, unconfigured, offers web search with every request."""
    function = {"type": "function", **WEATHER_TOOL["function"]}
    request = {"model": "default", "input": "What is the weather in Paris?", "store": False}
    _, _, alone = server.post(RESPONSES, {**request, "tools": [function]})
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "image_generation"}]
    for _ in range(2):  # said once, however often it is sent
        status, _, body = server.post(RESPONSES, {**request, "tools": [*hosted, function]})
        assert status == 200, body
        assert body["usage"]["input_tokens"] == alone["usage"]["input_tokens"]
        assert body["tools"][0]["type"] == "web_search"  # echoed as sent
    warnings = [line for line in server.log if "hosted tools this server cannot run" in line]
    for kind in ("image_generation", "web_search"):  # said once, by any request
        assert len([line for line in warnings if f"{kind}," in line or f"{kind})" in line]) == 1


def test_cache_hits_are_reported_and_a_divergence_is_shown(server):
    """Each reply says its prompt-cache hit (a header, the access log); a prompt that
    leaves a cached one early (a nonce in the system prompt) gets a log line showing where."""

    def ask(session: str):
        system = f"{SYSTEM}Session: {session}. {SYSTEM}"
        request = {"messages": [{"role": "system", "content": system}], "max_tokens": 2}
        request["messages"].append({"role": "user", "content": "Hello?"})
        status, headers, body = server.post("/v1/chat/completions", request)
        assert status == 200, body
        return headers, body["usage"]

    ask("k7f3q")
    headers, usage = ask("p2m8w")
    # its access line (the last it writes) is in the log, and its other lines with it
    access = server.log_lines(f'[{headers["X-Request-Id"]}] "POST /v1/chat/completions"')
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert headers["X-Prompt-Cache-Hit"] == f"{cached}/{usage['prompt_tokens']}"
    assert 0 < cached < usage["prompt_tokens"] // 2  # the second half was processed again
    lines = [line for line in server.log if "leaves a cached one at token" in line]
    assert lines and f"at token {cached} of {usage['prompt_tokens']}" in lines[-1], lines
    assert "Session:" in lines[-1].split(">>>")[0] and "p2m8w" in lines[-1].split(">>>")[1]
    assert f"prompt={usage['prompt_tokens']} cached={cached} " in access[-1]

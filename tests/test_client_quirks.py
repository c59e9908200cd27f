"""What clients send as they ship (api/quirks.py): Claude Code's per-session billing line
does not defeat the prompt cache, and hosted tools (Codex's web search, Anthropic's server
tools) are left out of the prompt instead of failing the request."""

from __future__ import annotations

import json

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


# OpenAI's older function calling (Dify's "Function Call" mode) ------------------------------

FUNCTION = WEATHER_TOOL["function"]


def test_functions_are_tools_answered_in_the_older_shape(server):
    """`functions` reach the prompt as tools do; the call comes back as
    `message.function_call` with finish_reason "function_call", whole and streamed."""
    import openai

    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = sdk.chat.completions.create(model="default", messages=question, functions=[FUNCTION])
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    assert json.loads(choice.message.function_call.arguments) == {"city": "Paris"}
    chunks = list(
        sdk.chat.completions.create(
            model="default", messages=question, functions=[FUNCTION], stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    name = "".join(d.function_call.name or "" for d in deltas if d.function_call)
    arguments = "".join(d.function_call.arguments or "" for d in deltas if d.function_call)
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    assert not any(d.tool_calls for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "function_call"
    # function_call "none": no call; a named one: that function
    none = sdk.chat.completions.create(
        model="default", messages=question, functions=[FUNCTION], function_call="none"
    )
    assert none.choices[0].message.function_call is None


def test_a_function_message_is_the_result_of_the_call_before_it(server):
    """A `function` message answers the assistant's `function_call`: the prompt is the one
    the same turn with tool_calls and a tool message renders."""
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    legacy = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "Sunny, 21 C"},
    ]
    modern = [
        legacy[0],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]  # fmt: skip
    counted = [
        server.post("/tokenize", {"messages": messages, "tools": [WEATHER_TOOL]})[2]["tokens"]
        for messages in (legacy, modern)
    ]
    assert counted[0] == counted[1]
    status, _, body = server.post(
        "/v1/chat/completions", {"messages": legacy, "tools": [WEATHER_TOOL], "functions": []}
    )
    assert status == 400 and "not both" in body["error"]["message"]


def test_every_name_a_request_may_use_has_a_model_entry(launch, tiny_model):
    """GET /v1/models/{id} for the served alias and --model-alias names, as requests use
    them: a client that checks its model first accepts a name that works."""
    srv = launch(tiny_model, "--model-alias", "claude-*=default", "--model-alias", "small=default")
    for name in ("default", "small", "claude-sonnet-4-5"):
        status, _, entry = srv.get(f"/v1/models/{name}")
        assert status == 200 and entry["id"] == name and entry["object"] == "model"
        assert entry["kind"] == "chat" and entry["context_length"] == 4096
    status, _, missing = srv.get("/v1/models/gpt-4o")
    assert status == 404 and missing["error"]["code"] == "model_not_found"

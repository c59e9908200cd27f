"""Dify's OpenAI-API-compatible model plugin against mlxserve, through `dify_plugin` as it
ships. The plugin (0.0.63, langgenius/dify-official-plugins, models/openai_api_compatible)
subclasses the SDK's `OAICompatLargeLanguageModel`, which builds the requests of both tool
modes and reads their replies, whole and streamed. The plugin's own module is not on PyPI
(Dify's marketplace ships it), so the SDK's class is driven here, through `invoke` as
Dify's plugin daemon calls it, with the credentials the plugin's form stores and what the
plugin's `_invoke` adds to a tool turn (usage asked for in a stream). What else it adds
changes nothing here: a `<think>` filter on the answer's text, and a reader of whole
replies that takes one without `content` too and reads tool calls as the SDK does.

Both of its tool modes, streamed and not: "Tool Call" (`tools`, `tool_calls`, `role:
"tool"`) and "Function Call" (OpenAI's older `functions`, `message.function_call`, `role:
"function"`). Each turn asks for the weather in Paris, gets the get_weather call back
through the SDK's parsing, and answers a second turn carrying the tool's result,
built as Dify's function-calling agent builds it.

dify_plugin 0.9.0 needs Python 3.12 or newer (the suite's virtualenv may be older): it is
installed once per version into a virtualenv of its own in the cache folder, made with a
such Python on this machine, and the driver below runs there."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from conversations import WEATHER_TOOL
from helpers.agents import pip_install, python_between

DIFY_PLUGIN = "dify_plugin==0.9.0"
MODES = ("tool_call", "function_call")  # the plugin's "Tool Call" and "Function Call"
TOOL_RESULT = "Sunny, 21 C"
DRIVE_SECONDS = 300
REQUESTS = 1 + len(MODES) * 2 * 2  # the credentials check, then two turns a round trip

# Run in the dify_plugin virtualenv with the server's URL, the tool (OpenAI's shape) and
# its result. Prints one JSON object: {mode: {"whole" or "stream": {"first": its calls and
# text, "second": its text and the number of its calls} or {"error": the traceback}}}.
DRIVER = r'''
import json
import sys
import traceback

from dify_plugin.entities.model.message import (
    AssistantPromptMessage,
    PromptMessageTool,
    ToolPromptMessage,
    UserPromptMessage,
)
from dify_plugin.interfaces.model.openai_compatible.llm import OAICompatLargeLanguageModel

URL, TOOL, RESULT = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
MODEL = "default"


class Plugin(OAICompatLargeLanguageModel):
    """The SDK's class as the plugin (0.0.63) calls it: it asks for usage in a stream."""

    def _invoke(self, model, credentials, prompt_messages, model_parameters, tools=None,
                stop=None, stream=True, user=None):
        if stream:
            model_parameters.setdefault("stream_options", {"include_usage": True})
        return super()._invoke(model, credentials, prompt_messages, model_parameters,
                               tools, stop, stream, user)


def credentials(mode):
    """What the plugin's form stores for a model (its defaults, this server's URL)."""
    return {
        "endpoint_url": URL + "/v1",
        "mode": "chat",
        "context_size": "4096",
        "max_tokens_to_sample": "4096",
        "function_calling_type": mode,
        "stream_function_calling": "supported",
        "vision_support": "no_support",
        "stream_mode_delimiter": "\\n\\n",
    }


def turn(llm, creds, messages, tools, stream):
    chunks = list(llm.invoke(MODEL, creds, messages, {"max_tokens": 48, "temperature": 0},
                             tools, None, stream, "dify-user"))
    content = "".join(c.delta.message.content or "" for c in chunks
                      if isinstance(c.delta.message.content, str))
    calls = [call for c in chunks for call in c.delta.message.tool_calls or []]
    return content, calls


def round_trip(mode, stream):
    llm, creds = Plugin(model_schemas=[]), credentials(mode)
    function = TOOL["function"]
    tools = [PromptMessageTool(name=function["name"], description=function["description"],
                               parameters=function["parameters"])]
    question = [UserPromptMessage(content="What is the weather in Paris?")]
    content, calls = turn(llm, creds, question, tools, stream)
    found = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
             for c in calls]
    # Dify's function-calling agent: the calls as one assistant message (their arguments
    # read and written again), then each result as a tool message named by its call.
    assistant = AssistantPromptMessage(content="", tool_calls=[
        AssistantPromptMessage.ToolCall(
            id=c.id, type="function",
            function=AssistantPromptMessage.ToolCall.ToolCallFunction(
                name=c.function.name,
                arguments=json.dumps(json.loads(c.function.arguments), ensure_ascii=False)))
        for c in calls])
    results = [ToolPromptMessage(content=RESULT, tool_call_id=c.id, name=c.function.name)
               for c in calls]
    second, second_calls = turn(llm, creds, [*question, assistant, *results], tools, stream)
    return {"first": {"content": content, "calls": found},
            "second": {"content": second, "calls": len(second_calls)}}


def main():
    llm = Plugin(model_schemas=[])
    llm.validate_credentials(MODEL, credentials("tool_call"))  # Dify's check on saving
    out = {}
    for mode in ("tool_call", "function_call"):
        for stream in (False, True):
            try:
                result = round_trip(mode, stream)
            except Exception:
                result = {"error": traceback.format_exc()}
            out.setdefault(mode, {})["stream" if stream else "whole"] = result
    print(json.dumps(out))


main()
'''


@pytest.fixture(scope="module")
def dify_python() -> Path:
    """The python of dify_plugin's own virtualenv (it needs Python 3.12 or newer)."""
    return pip_install(DIFY_PLUGIN, python_between((3, 12), (4, 0))) / "python"


@pytest.fixture(scope="module")
def driven(dify_python, server) -> dict:
    """Every mode's round trip, streamed and not, through the plugin's class (and the
    access lines of the requests it made)."""
    before = len(server.log)
    done = subprocess.run(
        [str(dify_python), "-", server.url, json.dumps(WEATHER_TOOL), TOOL_RESULT],
        input=DRIVER,
        capture_output=True,
        text=True,
        timeout=DRIVE_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10  # the log is read on another thread: lines may trail
    while len(lines := _posts(server.log[before:])) < REQUESTS and time.monotonic() < deadline:
        time.sleep(0.02)
    return {**result, "access": lines}


def _posts(log: list[str]) -> list[str]:
    return [line for line in log if '"POST /v1/chat/completions' in line]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_round_trip_in_each_mode(driven, mode, stream):
    """The plugin reads the get_weather call (its name and arguments) from the reply in
    the mode's own shape, and the turn that carries the tool's result is answered."""
    result = driven[mode]["stream" if stream else "whole"]
    assert "error" not in result, result.get("error")
    calls = result["first"]["calls"]
    assert [call["name"] for call in calls] == ["get_weather"], result
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    second = result["second"]
    assert second["content"] or second["calls"], result  # an answer came back (a 200)


def test_every_request_the_plugin_made_was_answered(driven):
    """No 4xx anywhere: the credentials check, and both turns of each mode, whole and
    streamed."""
    lines = driven["access"]
    assert len(lines) == REQUESTS, lines
    refused = [line for line in lines if not re.search(r'" 200 ', line)]
    assert refused == [], refused


def test_both_modes_put_the_same_prompts_before_the_model(driven):
    """The turns of "Function Call" mode are the prompts of "Tool Call" mode's (as many
    tokens): its `functions` reach the prompt as tools do, and its `function` message as
    the tool's result, answering the call before it."""
    turns = driven["access"][1:]  # after the credentials check: each mode's two turns
    prompts = [int(re.search(r" prompt=(\d+) ", line)[1]) for line in turns]
    assert prompts == prompts[:2] * len(MODES) * 2 and prompts[1] > prompts[0], prompts

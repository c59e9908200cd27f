"""OpenAI's Agents SDK as it ships, against the tiny chat model: an agent with a function
tool keeps its memory on the server, in an `OpenAIConversationsSession` (the Conversations
API's items, read and written by the SDK around each run) or as a server-side conversation
(`conversation_id`: the Responses API adds each turn). Each: a tool round trip (the call,
the SDK running the tool, the model's next turn) and a second turn on the same memory."""

from __future__ import annotations

import asyncio
import json
import re

from agents import Agent, FunctionTool, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.memory import OpenAIConversationsSession
from conversations import WEATHER_TOOL
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no traces sent to OpenAI


async def _weather(context, arguments: str) -> str:
    return f"Sunny in {json.loads(arguments)['city']}."


WEATHER = FunctionTool(
    name="get_weather",
    description=WEATHER_TOOL["function"]["description"],
    params_json_schema=WEATHER_TOOL["function"]["parameters"],
    on_invoke_tool=_weather,
    strict_json_schema=False,
)


def agent_and_client(srv) -> tuple[Agent, AsyncOpenAI]:
    client = AsyncOpenAI(base_url=srv.base_url, api_key="sk-local", max_retries=0)
    model = OpenAIResponsesModel(model="default", openai_client=client)
    return Agent(name="Weather", model=model, tools=[WEATHER]), client


def kinds(items: list) -> list[str]:
    return [item.type for item in items]


def test_a_conversations_session_keeps_the_memory(launch, tiny_model, tmp_path):
    srv = launch(tiny_model, "--batch-db", str(tmp_path / "state.sqlite"))
    agent, client = agent_and_client(srv)

    async def run() -> tuple:
        session = OpenAIConversationsSession(openai_client=client)
        first = await Runner.run(agent, "What is the weather in Paris?", session=session)
        second = await Runner.run(agent, "Hello!", session=session)
        return first, second, await session.get_items(), session.session_id

    first, second, remembered, conversation_id = asyncio.run(run())
    call, output = first.new_items[0].raw_item, first.new_items[1].raw_item
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert output["output"] == "Sunny in Paris."
    assert kinds(first.new_items) == [
        "tool_call_item",
        "tool_call_output_item",
        "message_output_item",
    ]
    assert kinds(second.new_items) == ["message_output_item"]
    # the session holds both turns, in order, as the server lists them
    roles = [item.get("role", item["type"]) for item in remembered]
    assert roles == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "assistant",
    ]
    assert remembered[0]["content"] == [
        {"type": "input_text", "text": "What is the weather in Paris?"}
    ]
    assert remembered[1]["call_id"] == call.call_id and remembered[2]["call_id"] == call.call_id
    listed = srv.get(f"/v1/conversations/{conversation_id}/items?order=asc&limit=100")[2]
    assert [item["id"] for item in listed["data"]] == [item["id"] for item in remembered]
    # the second turn's prompt holds the first turn and continues from its prompt cache
    posts = [line for line in srv.log if '"POST /v1/responses' in line]
    assert len(posts) == 3 and all('" 200 model=' in line for line in posts), posts
    prompts = [int(re.search(r" prompt=(\d+)", line).group(1)) for line in posts]
    cached = int(re.search(r" cached=(\d+)", posts[2]).group(1))
    assert prompts[2] > prompts[1] and cached >= prompts[1] - 2


def test_a_server_side_conversation_keeps_the_memory(launch, tiny_model, tmp_path):
    srv = launch(tiny_model, "--batch-db", str(tmp_path / "state.sqlite"))
    agent, client = agent_and_client(srv)

    async def run() -> tuple:
        conversation = await client.conversations.create(metadata={"user": "ada"})
        first = await Runner.run(
            agent, "What is the weather in Paris?", conversation_id=conversation.id
        )
        second = await Runner.run(agent, "Hello!", conversation_id=conversation.id)
        items = await client.conversations.items.list(conversation.id, order="asc", limit=100)
        return first, second, items.data

    first, second, items = asyncio.run(run())
    call = first.new_items[0].raw_item
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert kinds(second.new_items) == ["message_output_item"]
    assert [item.type for item in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "message",
    ]
    assert items[1].call_id == call.call_id and items[4].content[0].text == "Hello!"

"""The OpenAI Responses API end to end: the official SDK (create, stream, parse, retrieve,
delete) and raw HTTP against the trained fixture models, asserting exact output items,
statuses, usage, stored-response chains and errors."""

from __future__ import annotations

import json
import threading
import time

import openai
import pydantic
import pytest
from conversations import (
    BY_NAME,
    COLOUR_QUESTION,
    GEMMA_BY_NAME,
    HARMONY_BY_NAME,
    WEATHER_TOOL,
    data_uri,
    square_png,
)
from helpers.sse import stream
from helpers.streams import endless
from websockets.sync.client import connect

RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", **WEATHER_TOOL["function"]}
ENCRYPTED = "reasoning.encrypted_content"


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)


def body(conv, **extra) -> dict:
    """The Responses request for a fixture conversation of user (and system) turns."""
    request: dict = {"model": "default", "input": conv.messages, "max_output_tokens": 200}
    if conv.tools:
        request["tools"] = [WEATHER]
    return {**request, **extra}


def ask(sdk: openai.OpenAI, request: dict, streamed: bool):
    """The response, from `responses.create` or as `responses.stream` assembles it."""
    if not streamed:
        return sdk.responses.create(**request)
    with sdk.responses.stream(**request) as events:
        return events.get_final_response()


def items(response) -> list[dict]:
    """Output items as plain dicts, their ids checked and left out."""
    out = []
    for item in response.output:
        item = item.model_dump(exclude_none=True)
        prefix = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}[item["type"]]
        assert item.pop("id").startswith(prefix)
        if item["type"] == "function_call":
            assert item.pop("call_id").startswith("call_")
        out.append(item)
    return out


def expected_items(conv, summary: bool = False) -> list[dict]:
    """What the conversation's reply is as output items."""
    out: list[dict] = []
    if conv.reasoning:
        text = [{"type": "reasoning_text", "text": conv.reasoning}]
        summary_parts = [{"type": "summary_text", "text": conv.reasoning}] if summary else []
        out.append(
            {"type": "reasoning", "summary": summary_parts, "content": text, "status": "completed"}
        )
    content = conv.reply if conv.content is None and not conv.calls else conv.content
    if content:
        part = {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        out.append(
            {"type": "message", "role": "assistant", "status": "completed", "content": [part]}
        )
    for name, arguments in conv.calls:
        out.append(
            {"type": "function_call", "name": name, "arguments": arguments, "status": "completed"}
        )
    return out


def chat_prompt_tokens(srv, messages: list[dict], **extra) -> int:
    """The prompt tokens the Chat Completions dialect renders for these messages."""
    status, _, reply = srv.post(CHAT, {"messages": messages, "max_tokens": 1, **extra})
    assert status == 200, reply
    return reply["usage"]["prompt_tokens"]


def events_of(result) -> list[dict]:
    """The SSE events, checking the framing: each an `event:` line naming the data's type,
    sequence numbers counting up from 0, no [DONE]."""
    assert result.status == 200
    assert result.headers["Content-Type"].startswith("text/event-stream")
    names = [line[len("event: ") :] for line in result.lines if line.startswith("event: ")]
    events = result.chunks
    assert "[DONE]" not in result.data
    assert names == [event["type"] for event in events]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


# Whole replies and streams ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["capital", "system", "unicode", "think", "tool_call", "parallel_tool_calls"]
)
def test_replies_match_the_conversation_whole_and_streamed(server, name):
    conv = BY_NAME[name]
    sdk = client(server)
    response = sdk.responses.create(**body(conv))
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.model == "default"
    assert response.error is None and response.incomplete_details is None
    assert items(response) == expected_items(conv)
    assert "<think>" not in response.output_text and "<tool_call>" not in response.output_text
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    reasoning_tokens = usage.output_tokens_details.reasoning_tokens
    assert 0 < reasoning_tokens < usage.output_tokens if conv.reasoning else reasoning_tokens == 0
    with sdk.responses.stream(**body(conv)) as events:
        streamed = events.get_final_response()
    assert items(streamed) == items(response)
    assert streamed.status == "completed"
    assert streamed.usage.output_tokens == usage.output_tokens
    assert streamed.usage.input_tokens == usage.input_tokens


def test_raw_http_reply_shape(server):
    conv = BY_NAME["capital"]
    status, headers, reply = server.post(
        RESPONSES, body(conv, instructions=None, metadata={"k": "v"}, user="u1")
    )
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert reply["object"] == "response" and reply["status"] == "completed"
    assert isinstance(reply["created_at"], int)
    assert reply["metadata"] == {"k": "v"} and reply["user"] == "u1"
    assert reply["max_output_tokens"] == 200 and reply["store"] is True
    assert reply["text"] == {"format": {"type": "text"}} and reply["tool_choice"] == "auto"
    assert reply["truncation"] == "disabled" and reply["tools"] == []
    assert reply["previous_response_id"] is None
    [message] = reply["output"]
    assert message["content"] == [
        {"type": "output_text", "text": conv.reply, "annotations": [], "logprobs": []}
    ]
    assert set(reply["usage"]) == {
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    }
    assert reply["usage"]["input_tokens"] == chat_prompt_tokens(server, conv.messages)


def test_null_fields_are_their_defaults(server):
    """Some clients send every field, null where unset."""
    nulls = dict.fromkeys(
        ["instructions", "store", "truncation", "parallel_tool_calls", "stream", "reasoning"]
    )
    status, _, reply = server.post(RESPONSES, {**body(BY_NAME["capital"]), **nulls})
    assert status == 200, reply
    assert reply["store"] is True and reply["truncation"] == "disabled"
    assert reply["output"][0]["content"][0]["text"] == BY_NAME["capital"].reply


def test_a_string_input_is_one_user_message(server):
    conv = BY_NAME["capital"]
    response = client(server).responses.create(model="default", input=conv.messages[0]["content"])
    assert response.output_text == conv.reply


def test_instructions_are_the_system_turn(server):
    conv = BY_NAME["system"]
    response = client(server).responses.create(
        model="default", instructions=conv.messages[0]["content"], input=conv.messages[1:]
    )
    assert response.output_text == conv.reply
    assert response.instructions == conv.messages[0]["content"]
    assert response.usage.input_tokens == chat_prompt_tokens(server, conv.messages)


def test_stream_wire_format(server):
    """Typed events in order: the response is created and in progress, each item is added,
    filled and done, then the response completes; the reasoning item's text streams as
    reasoning_text events (and as a summary when one is asked for)."""
    conv = BY_NAME["think"]
    events = events_of(stream(server.url, RESPONSES, body(conv, reasoning={"summary": "auto"})))
    names = [event["type"] for event in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    created = events[0]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["usage"] is None
    item_names = [n for n in names if not n.startswith("response.") or ".delta" not in n]
    assert item_names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    reasoning_id = events[2]["item"]["id"]
    assert events[2]["item"] == {
        "id": reasoning_id,
        "type": "reasoning",
        "status": "in_progress",
        "summary": [],
        "content": [],
    }
    deltas = [e for e in events if e["type"] == "response.reasoning_text.delta"]
    summaries = [e for e in events if e["type"] == "response.reasoning_summary_text.delta"]
    assert "".join(e["delta"] for e in deltas) == conv.reasoning
    assert [e["delta"] for e in summaries] == [e["delta"] for e in deltas]
    assert all(e["item_id"] == reasoning_id and e["output_index"] == 0 for e in deltas)
    text = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in text) == conv.content
    assert all(e["output_index"] == 1 and e["content_index"] == 0 for e in text)
    assert all(e["logprobs"] == [] for e in text)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    final = events[-1]["response"]
    assert done == final["output"] and final["status"] == "completed"
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_function_call_arguments_stream_as_fragments(server):
    conv = BY_NAME["parallel_tool_calls"]
    events = events_of(stream(server.url, RESPONSES, body(conv)))
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [(a["type"], a["name"], a["arguments"]) for a in added] == [
        ("function_call", "get_weather", ""),
        ("function_call", "get_weather", ""),
    ]
    for index, (item, (_, arguments)) in enumerate(zip(added, conv.calls, strict=True)):
        fragments = [
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index
        ]
        assert len(fragments) > 1 and "".join(fragments) == arguments
        [done] = [
            e
            for e in events
            if e["type"] == "response.function_call_arguments.done" and e["item_id"] == item["id"]
        ]
        assert done["arguments"] == arguments and done["name"] == "get_weather"
    final = events[-1]["response"]
    assert [o["call_id"] for o in final["output"]] == [a["call_id"] for a in added]


# Tools ------------------------------------------------------------------------------------


def test_function_call_output_turn_renders_as_the_chat_tool_turn(gemma):
    """A function_call and its function_call_output reach a template without tools
    (tiny-gemma) exactly as the chat dialect sends them, and the model answers from it."""
    conv = GEMMA_BY_NAME["tool_result"]
    request = {
        "model": "default",
        "tools": [WEATHER],
        "input": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_0",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_0", "output": "Sunny, 21 C"},
        ],
    }
    response = client(gemma).responses.create(**request)
    assert response.output_text == conv.reply
    assert response.usage.input_tokens == chat_prompt_tokens(gemma, conv.messages, tools=conv.tools)


def test_injected_tool_call(gemma):
    conv = GEMMA_BY_NAME["tool_call"]
    response = client(gemma).responses.create(**body(conv))
    assert items(response) == expected_items(conv)
    assert "tool_code" not in response.output_text


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"]
)
def test_forced_tool_choice(server, choice):
    """The capital question, which the model answers in text, gets a function call."""
    request = body(BY_NAME["capital"], tools=[WEATHER], tool_choice=choice)
    response = client(server).responses.create(**request)
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert response.tool_choice == choice if isinstance(choice, str) else response.tool_choice.name


def test_tool_choice_none_and_one_call_without_parallel_calls(server):
    none = client(server).responses.create(**body(BY_NAME["tool_call"], tool_choice="none"))
    assert [item.type for item in none.output] == ["message"]
    single = client(server).responses.create(
        **body(BY_NAME["parallel_tool_calls"], parallel_tool_calls=False)
    )
    assert [(i.type, i.arguments) for i in single.output] == [
        ("function_call", '{"city": "Paris"}')
    ]


def test_namespaced_tools_are_offered_and_their_calls_name_the_namespace(server):
    """Codex groups tools in namespaces; their calls come back with the namespace."""
    space = {
        "type": "namespace",
        "name": "weather_v1",
        "description": "Weather.",
        "tools": [WEATHER],
    }
    status, _, reply = server.post(RESPONSES, body(BY_NAME["tool_call"], tools=[space]))
    assert status == 200, reply
    [call] = reply["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert call["namespace"] == "weather_v1"
    flat = client(server).responses.create(**body(BY_NAME["tool_call"]))
    assert reply["usage"]["input_tokens"] == flat.usage.input_tokens


# Structured output -------------------------------------------------------------------------


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)


def test_json_schema_output_through_parse(server):
    sdk = client(server)
    parsed = sdk.responses.parse(
        model="default",
        input=BY_NAME["capital"].messages,
        text_format=City,
        max_output_tokens=60,
    )
    assert isinstance(parsed.output_parsed, City)
    assert parsed.text.format.type == "json_schema" and parsed.text.format.name == "City"
    json_object = sdk.responses.create(
        **body(BY_NAME["think"], text={"format": {"type": "json_object"}}, max_output_tokens=400)
    )
    assert json_object.status == "completed"
    assert isinstance(json.loads(json_object.output_text), dict)


@pytest.mark.parametrize("streamed", [False, True])
def test_logprobs_when_included(server, streamed):
    """The chosen tokens spell the text, with the chat dialect's values."""
    conv = BY_NAME["capital"]
    request = body(conv, include=["message.output_text.logprobs"], top_logprobs=2)
    if streamed:
        events = events_of(stream(server.url, RESPONSES, request))
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        entries = [entry for e in deltas for entry in e["logprobs"]]
        [done] = [e for e in events if e["type"] == "response.output_text.done"]
        assert done["logprobs"] == entries
        part = events[-1]["response"]["output"][0]["content"][0]
        assert [{k: e[k] for k in ("token", "logprob")} for e in part["logprobs"]] == [
            {k: e[k] for k in ("token", "logprob")} for e in entries
        ]
    else:
        status, _, reply = server.post(RESPONSES, request)
        assert status == 200 and reply["top_logprobs"] == 2
        entries = reply["output"][0]["content"][0]["logprobs"]
        assert all(bytes(e["bytes"]).decode() == e["token"] for e in entries)
    assert "".join(e["token"] for e in entries) == conv.reply
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    status, _, chat = server.post(
        CHAT, {**conv.request, "logprobs": True, "top_logprobs": 2, "max_tokens": 200}
    )
    chat_entries = chat["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == [e["logprob"] for e in chat_entries]
    plain = client(server).responses.create(**body(conv, top_logprobs=2))
    assert plain.output[0].content[0].logprobs == []  # asked for only through include


# Reasoning ----------------------------------------------------------------------------------


def test_harmony_reasoning_and_function_call(harmony):
    for name in ("capital", "tool_call"):
        conv = HARMONY_BY_NAME[name]
        response = client(harmony).responses.create(**body(conv))
        assert items(response) == expected_items(conv)
        assert "<|channel|>" not in json.dumps(response.model_dump())


def test_reasoning_effort_and_none_reach_the_template(server):
    messages = BY_NAME["think"].messages
    sdk = client(server)

    def prompt(**extra) -> int:
        return sdk.responses.create(
            model="default", input=messages, max_output_tokens=1, **extra
        ).usage.input_tokens

    assert prompt(reasoning={"effort": "none"}) > prompt()  # the template writes an empty block
    assert prompt(reasoning={"effort": "high"}) == prompt()  # the tiny template ignores effort
    assert prompt(reasoning={"effort": "max"}) == prompt()  # served as high


def test_encrypted_reasoning_carries_a_stateless_conversation(server):
    """With store false and the encrypted reasoning included (Codex), the client sends the
    output back: the sealed reasoning goes back to the template; an altered seal or a
    foreign blob is left out of the prompt."""
    conv = BY_NAME["think"]
    sdk = client(server)
    first = sdk.responses.create(**body(conv, store=False, include=[ENCRYPTED]))
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content.startswith("mlxserve-rs1.")
    assert reasoning.content[0].text == conv.reasoning

    def prompt(reasoning_item: dict) -> int:
        history = [
            *conv.messages,
            reasoning_item,
            first.output[1].model_dump(exclude_none=True),
            {"role": "user", "content": "Count to five."},
        ]
        return sdk.responses.create(
            model="default", input=history, max_output_tokens=1, store=False
        ).usage.input_tokens

    sealed = {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content}
    tampered = {**sealed, "encrypted_content": reasoning.encrypted_content[:-4] + "AAAA"}
    foreign = {**sealed, "encrypted_content": "gAAAAABo-some-other-provider"}
    plain = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "x"}],
    }
    without = prompt(foreign)
    assert prompt(sealed) > without
    assert prompt(tampered) == prompt(plain) == without
    expected = chat_prompt_tokens(
        server,
        [
            *conv.messages,
            {"role": "assistant", "content": conv.content, "reasoning_content": conv.reasoning},
            {"role": "user", "content": "Count to five."},
        ],
    )
    assert prompt(sealed) == expected


# Stored responses ------------------------------------------------------------------------------


def test_previous_response_id_chains_from_the_prompt_cache(launch, tiny_model):
    srv = launch(tiny_model)
    sdk = client(srv)
    conv = BY_NAME["think"]
    first = sdk.responses.create(**body(conv))
    second = sdk.responses.create(
        model="default", input="Count to five.", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    history = [
        *conv.messages,
        {"role": "assistant", "content": conv.content, "reasoning_content": conv.reasoning},
        {"role": "user", "content": "Count to five."},
    ]
    # the same prompt and reply as the whole conversation sent to the chat dialect
    status, _, chat = srv.post(CHAT, {"messages": history, "max_tokens": 200})
    assert status == 200, chat
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert second.output_text == chat["choices"][0]["message"]["content"]
    # the chained turn continues from the cache: at least the whole first prompt is reused
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens
    third = sdk.responses.create(
        model="default", input="What is the capital of France?", previous_response_id=second.id
    )
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens


def test_item_references_stand_for_the_stored_items(server):
    """The Vercel AI SDK's default second turn: the earlier output as item_reference items
    (typed, or an id alone), the tool's output itself. The prompt is the conversation's
    with the items in their places (the referenced reasoning is the server's own, so it
    is rendered), continued from the prompt cache; the stored input lists the items."""
    sdk = client(server)
    think = BY_NAME["think"]
    first = sdk.responses.create(**body(think))
    reasoning, message = first.output
    again = {"role": "user", "content": "Count to five."}
    referenced = sdk.responses.create(
        model="default",
        input=[
            *think.messages,
            {"type": "item_reference", "id": reasoning.id},
            {"id": message.id},
            again,
        ],
        max_output_tokens=1,
    )
    history = [
        *think.messages,
        {"role": "assistant", "content": think.content, "reasoning_content": think.reasoning},
        again,
    ]
    assert referenced.usage.input_tokens == chat_prompt_tokens(server, history)
    assert referenced.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    listed = sdk.responses.input_items.list(referenced.id, order="asc").data
    assert [item.id for item in listed[1:3]] == [reasoning.id, message.id]
    assert listed[2].model_dump(exclude_none=True) == message.model_dump(exclude_none=True)

    weather = BY_NAME["tool_call"]
    called = sdk.responses.create(**body(weather))
    [call] = called.output
    answered = sdk.responses.create(
        model="default",
        input=[
            *weather.messages,
            {"type": "item_reference", "id": call.id},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."},
        ],
        tools=[WEATHER],
        max_output_tokens=1,
    )
    spelled = sdk.responses.create(
        model="default",
        input=[
            *weather.messages,
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."},
        ],
        tools=[WEATHER],
        max_output_tokens=1,
        store=False,
    )
    assert answered.usage.input_tokens == spelled.usage.input_tokens > called.usage.input_tokens


def test_an_item_reference_to_no_stored_item_is_a_404_naming_it(server):
    sdk = client(server)
    unkept = sdk.responses.create(**body(BY_NAME["capital"], store=False))
    for item_id in ("msg_nope", unkept.output[0].id):
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.responses.create(
                model="default", input=[*HI, {"type": "item_reference", "id": item_id}]
            )
        error = missing.value.body
        assert error["param"] == "input[1].id" and error["code"] == "item_not_found"
        assert f"'{item_id}'" in error["message"]
    kept = sdk.responses.create(**body(BY_NAME["capital"]))
    sdk.responses.delete(kept.id)
    status, _, reply = server.post(
        RESPONSES, {"model": "default", "input": [{"id": kept.output[0].id}]}
    )
    assert status == 404 and reply["error"]["param"] == "input[0].id"


def test_retrieve_input_items_and_delete(server):
    sdk = client(server)
    conv = BY_NAME["capital"]
    created = sdk.responses.create(**body(conv, metadata={"topic": "geography"}))
    retrieved = sdk.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()
    listed = sdk.responses.input_items.list(created.id)
    [item] = listed.data
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")
    assert item.content[0].model_dump(exclude_none=True) == {
        "type": "input_text",
        "text": conv.messages[0]["content"],
    }
    deleted = sdk.responses.delete(created.id)
    assert deleted is None  # the SDK returns nothing; the raw reply is checked below
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as chained:
        sdk.responses.create(model="default", input="Hi", previous_response_id=created.id)
    assert chained.value.body["code"] == "previous_response_not_found"
    assert chained.value.body["param"] == "previous_response_id"
    other = sdk.responses.create(**body(conv))
    status, _, reply = server.delete(f"{RESPONSES}/{other.id}")
    assert status == 200 and reply == {
        "id": other.id,
        "object": "response.deleted",
        "deleted": True,
    }
    status, _, reply = server.delete(f"{RESPONSES}/{other.id}")
    assert status == 404 and reply["error"]["code"] == "response_not_found"


def test_input_items_pages(server):
    messages = [{"role": "user", "content": f"Message {i}."} for i in range(5)]
    created = client(server).responses.create(model="default", input=messages, max_output_tokens=1)
    path = f"{RESPONSES}/{created.id}/input_items"
    status, _, page = server.get(f"{path}?limit=2&order=asc")
    assert status == 200 and page["object"] == "list" and page["has_more"] is True
    texts = [item["content"][0]["text"] for item in page["data"]]
    assert texts == ["Message 0.", "Message 1."]
    status, _, rest = server.get(f"{path}?order=asc&after={page['last_id']}")
    assert [i["content"][0]["text"] for i in rest["data"]] == [
        "Message 2.",
        "Message 3.",
        "Message 4.",
    ]
    assert rest["has_more"] is False and rest["first_id"] == rest["data"][0]["id"]
    status, _, newest = server.get(f"{path}?limit=1")
    assert newest["data"][0]["content"][0]["text"] == "Message 4."
    status, _, reply = server.get(f"{path}?limit=0")
    assert status == 400 and reply["error"]["param"] == "limit"


def test_store_false_is_not_kept(server):
    sdk = client(server)
    response = sdk.responses.create(**body(BY_NAME["capital"], store=False))
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(response.id)


def test_the_store_evicts_least_recently_used(launch, tiny_model):
    srv = launch(tiny_model, "--responses-store-size", "2")
    sdk = client(srv)
    request = body(BY_NAME["capital"], max_output_tokens=1)
    a, b = sdk.responses.create(**request), sdk.responses.create(**request)
    sdk.responses.retrieve(a.id)  # a is now more recent than b
    c = sdk.responses.create(**request)
    assert sdk.responses.retrieve(a.id).id == a.id and sdk.responses.retrieve(c.id).id == c.id
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(b.id)


def test_a_streamed_response_is_stored(server):
    events = events_of(stream(server.url, RESPONSES, body(BY_NAME["capital"])))
    final = events[-1]["response"]
    status, _, stored = server.get(f"{RESPONSES}/{final['id']}")
    assert status == 200 and stored == final


# Limits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
def test_max_output_tokens_is_incomplete(server, streamed):
    request = body(BY_NAME["story"], max_output_tokens=3)
    if streamed:  # the SDK's final response is a completed one's: this ends incomplete
        with client(server).responses.stream(**request) as events:
            [response] = [e.response for e in events if e.type == "response.incomplete"]
    else:
        response = client(server).responses.create(**request)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    [message] = response.output
    assert message.status == "incomplete"
    assert BY_NAME["story"].reply.startswith(message.content[0].text)


def test_context_length_exceeded_and_truncation_auto(launch, tiny_model):
    """Over the context: truncation disabled is a 400 naming the limit; auto drops the
    oldest turns until the prompt fits, keeping the system turn."""
    srv = launch(tiny_model, "--max-context", "120")
    conv = BY_NAME["capital"]
    old_turns = [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": BY_NAME["story"].reply},
    ]
    request = {
        "model": "default",
        "instructions": "You are a pirate.",
        "input": [*old_turns, *conv.messages],
        "max_output_tokens": 20,
    }
    status, _, reply = srv.post(RESPONSES, request)
    assert status == 400, reply
    assert reply["error"]["code"] == "context_length_exceeded"
    assert reply["error"]["param"] == "input" and "120" in reply["error"]["message"]
    status, _, reply = srv.post(RESPONSES, {**body(conv), "max_output_tokens": 500})
    assert status == 200 and reply["status"] == "completed", reply  # a ceiling
    status, _, reply = srv.post(RESPONSES, {**request, "truncation": "auto"})
    assert status == 200, reply
    assert reply["truncation"] == "auto"
    kept = [{"role": "system", "content": "You are a pirate."}, *conv.messages]
    assert reply["usage"]["input_tokens"] == chat_prompt_tokens(srv, kept)
    # One input too long alone: truncation disabled refuses it; auto keeps its end, as
    # much as fits with room to answer, also a megabyte past the size guard.
    for size in (200, 200_000):
        text = "word " * size + "What is the capital of France?"
        alone = {**request, "input": [{"role": "user", "content": text}]}
        status, _, reply = srv.post(RESPONSES, alone)
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
        status, _, reply = srv.post(RESPONSES, {**alone, "truncation": "auto"})
        assert status == 200 and reply["status"] in ("completed", "incomplete"), reply
        assert reply.get("incomplete_details") in (None, {"reason": "max_output_tokens"})
        used = reply["usage"]["input_tokens"]
        assert 120 - 20 - 8 <= used <= 120 - 20  # most of the room, and room for max_output
    tail = "word " * 20 + "What is the capital of France?"
    status, _, reply = srv.post(
        RESPONSES, {**request, "input": [{"role": "user", "content": tail}]}
    )
    assert status == 200 and reply["usage"]["input_tokens"] < used  # short: nothing cut


def test_keepalive_while_waiting(launch, tiny_model):
    """A request waiting for a slot gets the response created and keepalive comments."""
    single = launch(tiny_model, "--max-concurrent", "1", "--keepalive-seconds", "0.3")
    busy = threading.Thread(target=single.post, args=(CHAT, endless(tiny_model, max_tokens=1500)))
    busy.start()
    time.sleep(0.3)
    result = stream(single.url, RESPONSES, body(BY_NAME["capital"]))
    busy.join()
    assert result.comments and result.lines.index(result.comments[0]) < next(
        i for i, line in enumerate(result.lines) if "output_item.added" in line
    )
    assert events_of(result)[-1]["type"] == "response.completed"


# Images -------------------------------------------------------------------------------------------


def test_image_to_a_vision_model(vision):
    content = [
        {"type": "input_image", "image_url": data_uri(square_png("blue"))},
        {"type": "input_text", "text": COLOUR_QUESTION},
    ]
    response = client(vision).responses.create(
        model="default", input=[{"role": "user", "content": content}], max_output_tokens=20
    )
    assert response.output_text == "Blue."


def test_files_a_request_names(launch, vision_model, tmp_path):
    """Images uploaded with purpose vision or user_data, named by input_image's file_id or
    an input_file (or sent inline as file_data), reach the model as images; a text file
    as its name and text; other files, another purpose and unknown ids are refused,
    naming the part."""
    srv = launch(vision_model, "--batch-db", str(tmp_path / "state.sqlite"))
    sdk = client(srv)

    def ask(part: dict, text: str = COLOUR_QUESTION):
        content = [part, {"type": "input_text", "text": text}]
        return sdk.responses.create(
            model="default", input=[{"role": "user", "content": content}], max_output_tokens=20
        )

    blue = sdk.files.create(file=("blue.png", square_png("blue")), purpose="vision")
    red = sdk.files.create(file=("red.png", square_png("red")), purpose="user_data")
    assert ask({"type": "input_image", "file_id": blue.id}).output_text == "Blue."
    assert ask({"type": "input_file", "file_id": red.id}).output_text == "Red."
    inline = {"type": "input_file", "filename": "g.png", "file_data": data_uri(square_png("green"))}
    assert ask(inline).output_text == "Green."

    notes = sdk.files.create(file=("notes.txt", b"Buy milk."), purpose="user_data")
    read = ask({"type": "input_file", "file_id": notes.id}, "Hello!")
    text = [
        {"type": "text", "text": "File notes.txt:\nBuy milk."},
        {"type": "text", "text": "Hello!"},
    ]
    assert read.usage.input_tokens == chat_prompt_tokens(srv, [{"role": "user", "content": text}])

    def refused(part: dict) -> dict:
        with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as error:
            ask(part)
        return error.value.body

    pdf = sdk.files.create(file=("paper.pdf", b"%PDF-1.4 ..."), purpose="user_data")
    assert refused({"type": "input_file", "file_id": pdf.id})["code"] == "unsupported_file"
    batch = sdk.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
    assert "purpose is 'batch'" in refused({"type": "input_image", "file_id": batch.id})["message"]
    missing = refused({"type": "input_image", "file_id": "file-nope"})
    assert missing["code"] == "file_not_found" and missing["param"] == "input[0].content[0].file_id"
    link = {"type": "input_file", "file_url": "http://example.com/paper.pdf"}
    assert refused(link)["param"] == "input[0].content[0].file_url"
    with pytest.raises(openai.BadRequestError) as purpose:
        sdk.files.create(file=("x.txt", b"x"), purpose="assistants")
    assert purpose.value.body["param"] == "purpose"


# Errors --------------------------------------------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]
ERRORS = [
    ({"model": "default"}, "input"),
    ({"model": "default", "input": []}, "input"),
    ({"model": "default", "input": HI, "temperature": 3}, "temperature"),
    ({"model": "default", "input": HI, "max_output_tokens": 0}, "max_output_tokens"),
    (
        {
            "model": "default",
            "input": HI,
            "tools": [{"type": "web_search"}],
            "tool_choice": {"type": "function", "name": "web_search"},
        },
        "web_search",
    ),
    ({"model": "default", "input": HI, "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "default", "input": HI, "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"model": "default", "input": HI, "background": True}, "background"),
    ({"model": "default", "input": HI, "include": ["everything"]}, "include"),
    ({"model": "default", "input": HI, "truncation": "middle"}, "truncation"),
    # fields of OpenAI's that would change the reply and are not served: never dropped
    ({"model": "default", "input": HI, "moderation": {"model": "omni"}}, "moderation"),
    (
        {"model": "default", "input": HI, "context_management": [{"type": "compaction"}]},
        "context_management",
    ),
    (
        {"model": "default", "input": HI, "prompt_cache_options": {"prewarm": True}},
        "prompt_cache_options.prewarm",
    ),
    ({"model": "default", "input": HI, "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"model": "default", "input": HI, "reasoning": {"context": "all_turns"}}, "reasoning.context"),
    ({"model": "default", "input": HI, "reasoning": {"mode": "pro"}}, "reasoning.mode"),
    (
        {"model": "default", "input": HI, "image": {"context_compression": "enabled"}},
        "image.context_compression",
    ),
    (
        {"model": "default", "input": HI, "stream_options": {"include_obfuscation": 1}},
        "stream_options.include_obfuscation",
    ),
    (
        {"model": "default", "input": HI, "text": {"format": {"type": "json_schema"}}},
        "text.format.name",
    ),
    ({"model": "default", "input": [{"type": "web_search_call", "id": "ws_1"}]}, "web_search_call"),
    ({"model": "default", "input": [{"role": "tool", "content": "x"}]}, "input[0]"),
    (
        {"model": "default", "input": [{"role": "user", "content": [{"type": "input_file"}]}]},
        "needs a file_id",
    ),
    (
        {"model": "default", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
        "image_url",
    ),
    (
        {
            "model": "default",
            "input": [
                *HI,
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_image", "image_url": "http://x/a.png"}],
                },
            ],
        },
        "user message",
    ),
    ({"model": "default", "input": [{"role": "developer", "content": "Be brief."}]}, "no message"),
    ({"model": "default", "input": HI, "tools": [WEATHER, WEATHER]}, "Two tools"),
]


@pytest.mark.parametrize(("request_body", "mentions"), ERRORS)
def test_client_mistakes_are_400_in_openai_shape(server, request_body, mentions):
    status, _, reply = server.post(RESPONSES, request_body)
    assert status == 400, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert mentions in error["message"] + str(error["param"])


NOT_SERVED = {  # a field -> a value asking what the server cannot do, and the param named
    "moderation": ({"model": "omni-moderation-latest"}, "moderation"),
    "context_management": (
        [{"type": "compaction", "compact_threshold": 1000}],
        "context_management",
    ),
    "prompt_cache_options": ({"prewarm": True}, "prompt_cache_options.prewarm"),
    "text": ({"verbosity": "high"}, "text.verbosity"),
    "reasoning": ({"context": "current_turn"}, "reasoning.context"),
    "image": ({"context_compression": "enabled"}, "image.context_compression"),
}


@pytest.mark.parametrize("field", NOT_SERVED)
def test_fields_not_served_are_named_over_http_and_the_socket(server, field):
    """The 400 names the field exactly, over HTTP and as a WebSocket turn's error event."""
    value, param = NOT_SERVED[field]
    request = {**body(BY_NAME["capital"]), field: value}
    status, _, reply = server.post(RESPONSES, request)
    assert status == 400 and reply["error"]["param"] == param, reply
    assert "served" in reply["error"]["message"]
    with connect(server.url.replace("http://", "ws://") + RESPONSES, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "response.create", **request}))
        event = json.loads(ws.recv(timeout=120))
    assert event["type"] == "error" and event["status"] == 400
    assert event["error"]["param"] == param


def test_what_clients_send_that_changes_nothing_is_served(server):
    """Codex's fields (as it sends them), the SDK's caching and routing hints, and each
    not-served field at the value that asks for nothing: the trained reply."""
    conv = BY_NAME["capital"]
    request = body(
        conv,
        include=[ENCRYPTED],
        prompt_cache_key="019a-session",
        client_metadata={"x-codex-turn": "1"},
        reasoning={"effort": "max", "summary": "auto", "context": "auto", "mode": "standard"},
        store=False,
        parallel_tool_calls=False,
        tool_choice="auto",
        service_tier="priority",
        safety_identifier="user-1",
        prompt_cache_retention="24h",
        prompt_cache_options={"mode": "explicit", "ttl": "12h", "prewarm": False},
        text={"verbosity": "medium"},
        stream_options={"include_obfuscation": False},
        image={"context_compression": "disabled"},
        moderation=None,
        context_management=[],
        access_programs={"cyber": "standard"},
        background_options={"completion_window": "soonest"},
        max_tool_calls=3,
    )
    status, _, reply = server.post(RESPONSES, request)
    assert status == 200, reply
    assert reply["output"][-1]["content"][0]["text"] == conv.reply
    assert reply["service_tier"] == "default" and reply["max_tool_calls"] == 3
    assert reply["reasoning"] == {"effort": "max", "summary": "auto"}


def test_unknown_ids_methods_and_models(server):
    sdk = client(server)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.retrieve("resp_nope")
    assert missing.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="no-such-model", input="Hi")
    status, _, reply = server.get(RESPONSES)
    assert status == 405
    status, _, reply = server.get(f"{RESPONSES}/resp_nope/other")
    assert status == 404 and reply["error"]["code"] == "unknown_url"
    status, _, reply = server.delete(CHAT)
    assert status == 405
    status, _, reply = server.delete("/v1/nothing")
    assert status == 404
    _, _, metrics = server.get("/metrics")
    assert 'endpoint="/v1/responses/{response_id}"' in metrics and "resp_nope" not in metrics
    assert sdk.responses.create(**body(BY_NAME["capital"])).output_text == BY_NAME["capital"].reply

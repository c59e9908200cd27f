"""OpenAI's Conversations API end to end, through the official SDK and raw HTTP: exact
shapes, pages, errors, a conversation continued by the Responses API (its prompt as the
whole conversation's, from the prompt cache, the turn added in order), item references
into it, and its durability across a kill -9."""

from __future__ import annotations

import openai
import pytest
from conversations import BY_NAME

CONVERSATIONS = "/v1/conversations"
CHAT = "/v1/chat/completions"
CAPITAL = BY_NAME["capital"]


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def conversing(launch_module, tiny_model, tmp_path_factory):
    db = tmp_path_factory.mktemp("conversations") / "state.sqlite"
    return launch_module(tiny_model, "--batch-db", str(db))


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def test_create_retrieve_update_delete(conversing):
    status, _, made = conversing.post(
        CONVERSATIONS, {"items": [user("Hi")], "metadata": {"topic": "greeting"}}
    )
    assert status == 200
    assert set(made) == {"id", "object", "created_at", "metadata"}
    assert made["id"].startswith("conv_") and made["object"] == "conversation"
    assert made["metadata"] == {"topic": "greeting"} and isinstance(made["created_at"], int)
    path = f"{CONVERSATIONS}/{made['id']}"
    assert conversing.get(path)[2] == made
    status, _, updated = conversing.post(path, {"metadata": {"topic": "weather"}})
    assert status == 200 and updated == {**made, "metadata": {"topic": "weather"}}
    assert conversing.get(path)[2] == updated
    status, _, deleted = conversing.delete(path)
    assert status == 200
    assert deleted == {"id": made["id"], "object": "conversation.deleted", "deleted": True}
    for status, _, reply in (conversing.get(path), conversing.delete(path)):
        assert status == 404 and reply["error"]["code"] == "conversation_not_found"
    assert conversing.get(f"{path}/items")[0] == 404


def test_items_are_kept_with_ids_and_listed_in_pages(conversing):
    sdk = client(conversing)
    conversation = sdk.conversations.create(items=[user(f"Message {i}.") for i in range(3)])
    added = sdk.conversations.items.create(
        conversation.id,
        items=[
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        ],
    )
    assert [item.type for item in added.data] == ["function_call", "function_call_output"]
    assert added.data[0].id.startswith("fc_") and added.data[1].id.startswith("fco_")
    assert added.has_more is False and added.first_id == added.data[0].id
    path = f"{CONVERSATIONS}/{conversation.id}/items"
    status, _, newest = conversing.get(f"{path}?limit=2")
    assert status == 200 and set(newest) == {"object", "data", "first_id", "last_id", "has_more"}
    assert newest["object"] == "list" and newest["has_more"] is True
    assert [item["type"] for item in newest["data"]] == ["function_call_output", "function_call"]
    _, _, rest = conversing.get(f"{path}?limit=5&after={newest['last_id']}")
    assert [item["content"][0]["text"] for item in rest["data"]] == [
        "Message 2.",
        "Message 1.",
        "Message 0.",
    ]
    assert rest["has_more"] is False
    first = rest["data"][-1]
    assert first == {
        "type": "message",
        "id": first["id"],
        "role": "user",
        "content": [{"type": "input_text", "text": "Message 0."}],
        "status": "completed",
    }
    _, _, ascending = conversing.get(f"{path}?order=asc&limit=100")
    assert [item["id"] for item in ascending["data"]] == [
        item["id"] for item in [*rest["data"][::-1], *newest["data"][::-1]]
    ]
    assert (
        sdk.conversations.items.retrieve(first["id"], conversation_id=conversation.id).id
        == first["id"]
    )
    kept = sdk.conversations.items.delete(first["id"], conversation_id=conversation.id)
    assert kept.id == conversation.id and kept.object == "conversation"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.conversations.items.retrieve(first["id"], conversation_id=conversation.id)
    assert missing.value.body["code"] == "item_not_found"
    assert len(conversing.get(f"{path}?limit=100")[2]["data"]) == 4


ERRORS = [
    ("", {"items": [user("x")] * 21}, "items"),
    ("", {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("", {"items": [{"type": "compaction_trigger"}]}, "items[0].type"),
    ("", {"items": [{"type": "web_search_call", "id": "ws_1"}]}, "items[0].type"),
    ("", {"items": [{"type": "item_reference", "id": "msg_nope"}]}, "items[0].id"),
    ("/{id}", {}, "metadata"),
    ("/{id}/items", {"items": []}, "items"),
    ("/{id}/items?include=everything", {"items": [user("x")]}, "include"),
    ("/{id}/items?limit=0", None, "limit"),
    ("/{id}/items?order=sideways", None, "order"),
    ("/{id}/items?after=msg_nope", None, "after"),
]


@pytest.mark.parametrize(("path", "body", "param"), ERRORS)
def test_client_mistakes_are_4xx_naming_the_field(conversing, path, body, param):
    made = client(conversing).conversations.create()
    url = CONVERSATIONS + path.replace("{id}", made.id)
    status, _, reply = conversing.post(url, body) if body is not None else conversing.get(url)
    assert status in (400, 404), reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["param"] == param


def test_methods_and_paths(conversing):
    assert conversing.get(CONVERSATIONS)[0] == 405
    made = client(conversing).conversations.create()
    assert conversing.delete(f"{CONVERSATIONS}/{made.id}/items")[0] == 405
    status, _, reply = conversing.get(f"{CONVERSATIONS}/{made.id}/other")
    assert status == 404 and reply["error"]["code"] == "unknown_url"
    _, _, metrics = conversing.get("/metrics")
    assert (
        'endpoint="/v1/conversations/{conversation_id}/items"' in metrics and made.id not in metrics
    )


def test_a_response_continues_the_conversation_and_adds_its_turn(conversing):
    """The prompt is the conversation's items then the input, as the whole conversation
    sent to the chat dialect renders; the turn's input and output are added in order; the
    next turn continues from the prompt cache."""
    sdk = client(conversing)
    conversation = sdk.conversations.create(items=CAPITAL.messages)
    first = sdk.responses.create(
        model="default", input="Hello!", conversation=conversation.id, max_output_tokens=30
    )
    assert first.conversation.id == conversation.id
    history = [*CAPITAL.messages, {"role": "user", "content": "Hello!"}]
    status, _, chat = conversing.post(CHAT, {"messages": history, "max_tokens": 30})
    assert status == 200, chat
    assert first.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert first.output_text == chat["choices"][0]["message"]["content"]
    second = sdk.responses.create(
        model="default",
        input=[user("What is the capital of France?")],
        conversation={"id": conversation.id},
        max_output_tokens=30,
    )
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    listed = sdk.conversations.items.list(conversation.id, order="asc").data
    assert [(item.type, item.role) for item in listed] == [
        ("message", "user"),
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert listed[2].id == first.output[0].id and listed[4].id == second.output[0].id

    # an item of the conversation may be referenced from another request
    def prompt(answer: dict) -> int:
        turn = [*CAPITAL.messages, answer, user("Hello!")]
        response = sdk.responses.create(
            model="default", input=turn, max_output_tokens=1, store=False
        )
        return response.usage.input_tokens

    spelled = {"role": "assistant", "content": second.output_text}
    assert prompt({"type": "item_reference", "id": listed[4].id}) == prompt(spelled)
    with pytest.raises(openai.BadRequestError) as both:
        sdk.responses.create(
            model="default", input="Hi", conversation=conversation.id, previous_response_id=first.id
        )
    assert both.value.body["param"] == "conversation"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.create(model="default", input="Hi", conversation="conv_nope")
    assert missing.value.body["param"] == "conversation"
    assert missing.value.body["code"] == "conversation_not_found"


def test_a_streamed_turn_is_added_before_the_stream_ends(conversing):
    sdk = client(conversing)
    conversation = sdk.conversations.create()
    with sdk.responses.stream(
        model="default", input=CAPITAL.messages, conversation=conversation.id, max_output_tokens=30
    ) as events:
        final = events.get_final_response()
    listed = sdk.conversations.items.list(conversation.id, order="asc").data
    assert [item.id for item in listed][-1] == final.output[0].id
    assert listed[-1].content[0].text == CAPITAL.reply


def test_conversations_survive_a_kill(launch, tiny_model, tmp_path):
    db = str(tmp_path / "state.sqlite")
    first = launch(tiny_model, "--batch-db", db)
    sdk = client(first)
    conversation = sdk.conversations.create(items=CAPITAL.messages, metadata={"k": "v"})
    reply = sdk.responses.create(model="default", input="Hello!", conversation=conversation.id)
    items = sdk.conversations.items.list(conversation.id, order="asc").data
    first.process.kill()  # kill -9: what the client was told is on disk
    first.process.wait()
    second = launch(tiny_model, "--batch-db", db)
    sdk = client(second)
    assert sdk.conversations.retrieve(conversation.id).model_dump() == conversation.model_dump()
    again = sdk.conversations.items.list(conversation.id, order="asc").data
    assert [item.model_dump() for item in again] == [item.model_dump() for item in items]
    assert again[-1].id == reply.output[0].id

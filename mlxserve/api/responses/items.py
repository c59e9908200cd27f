"""Input items as the server keeps them (a stored response's input, a conversation's items):
each with an id, string content as parts, messages `completed`, as OpenAI lists them."""

from __future__ import annotations

from pydantic import TypeAdapter

from mlxserve.api.responses.conversation import InputItem, MessageItem
from mlxserve.api.responses.output import new_id

ITEM_ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "compaction": "cmp",
    "compaction_trigger": "cmpt",
}

_ITEMS = TypeAdapter(list[InputItem])


def substituted(items: list, stored: dict[int, dict]) -> list:
    """`items` (input item models) with the stored item in place of each reference
    (`stored`: its index -> the stored item)."""
    found = iter(_ITEMS.validate_python(list(stored.values())))
    return [next(found) if i in stored else item for i, item in enumerate(items)]


def kept(items: list, stored: dict[int, dict]) -> list[dict]:
    """`items` (input item models) as kept; `stored`: the index of an item a reference
    stood for -> the stored item, kept as it was stored."""
    out = []
    for i, item in enumerate(items):
        if i in stored:
            out.append(stored[i])
            continue
        body = item.model_dump(by_alias=True, exclude_none=True)
        if isinstance(item, MessageItem):
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                body["content"] = [{"type": kind, "text": item.content}]
            body["status"] = "completed"
        body.setdefault("type", "message")
        body.setdefault("id", new_id(ITEM_ID_PREFIXES.get(body["type"], "item")))
        out.append(body)
    return out

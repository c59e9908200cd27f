"""The session's conversation: its items in order, as the Realtime API shows them
(`realtime.item`), and as the chat messages the model reads. An audio item is read by
its transcript: the chat model hears through the transcription model."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from mlxserve.api.realtime.wire import ItemBody
from mlxserve.protocol.errors import bad_request, not_found


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass
class Spoken:
    """What an assistant's audio part said, sentence by sentence: where each sentence's
    text ends and where its audio ends (ms), so a truncation keeps what was heard."""

    text_ends: list[int] = field(default_factory=list)
    audio_ends: list[int] = field(default_factory=list)

    @property
    def audio_ms(self) -> int:
        return self.audio_ends[-1] if self.audio_ends else 0

    def heard(self, audio_end_ms: int) -> int:
        """Characters of the transcript whose audio began before `audio_end_ms`."""
        heard, started = 0, 0
        for text_end, audio_end in zip(self.text_ends, self.audio_ends, strict=True):
            if started >= audio_end_ms:
                break
            heard, started = text_end, audio_end
        return heard


class Conversation:
    """Items by id, in order (one session's: only its connection thread and its one work
    thread touch them, the latter under the session's lock)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.spoken: dict[str, Spoken] = {}  # assistant audio items' sentences

    def add(self, item: dict, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (the end when None); the id it follows."""
        if any(i["id"] == item["id"] for i in self.items):
            raise bad_request(f"Item '{item['id']}' already exists.", "item.id")
        at = len(self.items)
        if previous_item_id is not None:
            at = self._index(previous_item_id, "previous_item_id") + 1
        self.items.insert(at, item)
        return self.items[at - 1]["id"] if at else None

    def get(self, item_id: str, param: str = "item_id") -> dict:
        return self.items[self._index(item_id, param)]

    def delete(self, item_id: str) -> None:
        del self.items[self._index(item_id, "item_id")]
        self.spoken.pop(item_id, None)

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """Cut an assistant audio part to what the user heard: its transcript keeps the
        sentences whose audio had begun by `audio_end_ms`."""
        item = self.get(item_id)
        parts = item.get("content") or []
        if item.get("role") != "assistant" or not 0 <= content_index < len(parts):
            raise bad_request("Only an assistant message's audio part can be truncated.", "item_id")
        part = parts[content_index]
        spoken = self.spoken.get(item_id)
        if part.get("type") != "output_audio" or spoken is None:
            raise bad_request("That content part holds no audio.", "content_index")
        if audio_end_ms > spoken.audio_ms:
            raise bad_request(
                f"audio_end_ms ({audio_end_ms}) is beyond the audio ({spoken.audio_ms} ms).",
                "audio_end_ms",
            )
        part["transcript"] = (part.get("transcript") or "")[: spoken.heard(audio_end_ms)]

    def _index(self, item_id: str, param: str) -> int:
        for i, item in enumerate(self.items):
            if item["id"] == item_id:
                return i
        raise not_found(f"Item with item_id '{item_id}' does not exist.", param)

    def messages(self, items: list[dict] | None = None) -> list[dict]:
        """The items as Chat Completions messages: a function call joins the assistant
        message before it, its output is a tool message."""
        messages: list[dict] = []
        for item in self.items if items is None else items:
            kind = item["type"]
            if kind == "function_call":
                call = {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"] or "{}"},
                }
                if messages and messages[-1]["role"] == "assistant":
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append(
                    {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
                )
            else:
                text = "".join(_part_text(part) for part in item.get("content") or [])
                messages.append({"role": item["role"], "content": text})
        return messages


def _part_text(part: dict) -> str:
    if part["type"] in ("input_audio", "output_audio"):
        return part.get("transcript") or ""
    return part.get("text") or ""


def item_from(body: ItemBody) -> dict:
    """A client's item as the session keeps it (and shows it back). An audio part keeps
    its transcript (filled once transcribed); its audio is not echoed back."""
    item: dict = {"id": body.id or new_id("item"), "type": body.type, "object": "realtime.item"}
    if body.type == "message":
        if body.role is None or not body.content:
            raise bad_request("A message item needs a role and content.", "item.content")
        allowed = {
            "user": ("input_text", "input_audio"),
            "system": ("input_text",),
            "assistant": ("output_text", "output_audio", "text", "audio"),
        }[body.role]
        content = []
        for i, part in enumerate(body.content):
            if part.type not in allowed:
                raise bad_request(
                    f"A {body.role} message cannot hold '{part.type}' content.",
                    f"item.content[{i}].type",
                )
            content.append(_stored_part(part))
        item.update(status="completed", role=body.role, content=content)
    elif body.type == "function_call":
        if not body.call_id or not body.name:
            raise bad_request("A function_call item needs call_id and name.", "item.call_id")
        item.update(
            status="completed", call_id=body.call_id, name=body.name, arguments=body.arguments or ""
        )
    else:
        if not body.call_id or body.output is None:
            raise bad_request(
                "A function_call_output item needs call_id and output.", "item.call_id"
            )
        item.update(call_id=body.call_id, output=body.output)
    return item


def _stored_part(part) -> dict:
    kind = {"text": "output_text", "audio": "output_audio"}.get(part.type, part.type)
    if kind in ("input_text", "output_text"):
        return {"type": kind, "text": part.text or ""}
    return {"type": kind, "transcript": part.transcript}

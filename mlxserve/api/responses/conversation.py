"""Input items: their wire models, and the conversation they make as neutral messages.

A response's output comes back as separate items (reasoning, a message, function calls);
the chat template wants one assistant turn holding them all, so consecutive assistant
items are gathered into one neutral assistant message."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag

from mlxserve.api.responses.compaction import expanded
from mlxserve.api.responses.files import FileInput, FileInputs
from mlxserve.api.responses.sealed import REASONING
from mlxserve.api.wire import Strict
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request

log = logging.getLogger(__name__)


class InputText(Strict):
    type: Literal["input_text", "output_text"]
    text: str


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(Strict):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None  # accepted; the model's processor decides the resolution


class InputFile(Strict):
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None  # base64, or a data URL
    file_url: str | None = None
    filename: str | None = None


class AudioData(Strict):
    data: str  # base64
    format: str  # wav, mp3; anything PyAV decodes is read


class InputAudio(Strict):
    type: Literal["input_audio"]
    input_audio: AudioData


Part = Annotated[
    InputText | Refusal | InputImage | InputFile | InputAudio, Field(discriminator="type")
]


class MessageItem(Strict):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str
    output: str | list[Part]


class ReasoningText(Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class CompactionItem(Strict):
    """A conversation compacted into a sealed summary (see compaction.py)."""

    type: Literal["compaction"]
    id: str | None = None
    encrypted_content: str


class CompactionTrigger(Strict):
    """Ends an input whose reply is to be its compaction (see compaction.py)."""

    type: Literal["compaction_trigger"]


class ItemReference(Strict):
    """A stored item named by its id, standing for the item itself: the Vercel AI SDK
    sends a conversation's earlier output so (its type may be left out)."""

    type: Literal["item_reference"] = "item_reference"
    id: str


class McpListToolsItem(Strict):
    """The tools an MCP server listed: kept for the turns that continue (they are not
    listed again), never in the prompt (the tools are offered as the request names them)."""

    type: Literal["mcp_list_tools"]
    id: str | None = None
    server_label: str
    tools: list[dict]
    error: str | dict | None = None


class McpCallItem(Strict):
    """A call to an MCP tool that the server ran: in the prompt, the model's call and its
    output (or its error) as the tool's reply; a call that was approved first is already
    in the prompt (its approval request), and adds the reply only."""

    type: Literal["mcp_call"]
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: str | dict | None = None
    approval_request_id: str | None = None

    def reply(self) -> str:
        if self.output is not None:
            return self.output
        error = self.error
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error.get("content", error))
        return f"Error: {error or 'the call gave no output'}"


class McpApprovalRequestItem(Strict):
    """A call to an MCP tool waiting for the user's approval: the model's call."""

    type: Literal["mcp_approval_request"]
    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(Strict):
    """The user's answer to an approval request: approved, the call runs (its mcp_call
    item holds the reply); denied, the model is told so as the call's reply."""

    type: Literal["mcp_approval_response"]
    id: str | None = None
    approval_request_id: str
    approve: bool
    reason: str | None = None

    def denial(self) -> str:
        return "The user did not approve this call" + (f": {self.reason}" if self.reason else ".")


class OtherItem(Strict):
    """An item of a hosted tool or feature (web_search_call, mcp_call...): refused."""

    type: str


def _item_kind(value) -> str | None:
    """The item's model (an item without a type is a message, or a reference when it has
    an id and no role); the tags are the models' names, which error locations leave out.
    None (not an item: `null`, a number) is a 400 naming it."""
    if isinstance(value, dict):
        untyped = "item_reference" if "id" in value and "role" not in value else "message"
        kind = untyped if value.get("type") is None else value["type"]
    else:
        kind = getattr(value, "type", None)
    return KNOWN.get(kind, "OtherItem") if isinstance(kind, str) else None


KNOWN = {
    "message": "MessageItem",
    "function_call": "FunctionCallItem",
    "function_call_output": "FunctionCallOutputItem",
    "reasoning": "ReasoningItem",
    "compaction": "CompactionItem",
    "compaction_trigger": "CompactionTrigger",
    "item_reference": "ItemReference",
    "mcp_list_tools": "McpListToolsItem",
    "mcp_call": "McpCallItem",
    "mcp_approval_request": "McpApprovalRequestItem",
    "mcp_approval_response": "McpApprovalResponseItem",
}
InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")]
    | Annotated[CompactionItem, Tag("CompactionItem")]
    | Annotated[CompactionTrigger, Tag("CompactionTrigger")]
    | Annotated[ItemReference, Tag("ItemReference")]
    | Annotated[McpListToolsItem, Tag("McpListToolsItem")]
    | Annotated[McpCallItem, Tag("McpCallItem")]
    | Annotated[McpApprovalRequestItem, Tag("McpApprovalRequestItem")]
    | Annotated[McpApprovalResponseItem, Tag("McpApprovalResponseItem")]
    | Annotated[OtherItem, Tag("OtherItem")],
    Discriminator(_item_kind),
]


@dataclass
class _AssistantTurn:
    parts: list[neutral.Part] = field(default_factory=list)
    calls: list[neutral.ToolCall] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    param: str = ""


@dataclass
class Conversation:
    """Translates items; the first `stored` come from stored responses or a conversation,
    the rest are the request's `input`. The reasoning of the items in `own` (indices) is this server's:
    the stored ones and those an item_reference stood for."""

    stored: int = 0
    own: frozenset[int] = frozenset()
    history: str = "previous_response_id"  # the field the stored items came by
    files: FileInputs | None = None  # where file ids are read (None: they are refused)
    _out: list[neutral.Message] = field(default_factory=list, init=False)
    _turn: _AssistantTurn | None = field(default=None, init=False)
    _replies: list[neutral.Message] = field(default_factory=list, init=False)  # MCP outputs

    def messages(self, items: list, instructions: str | None) -> tuple[neutral.Message, ...]:
        for i, item in enumerate(items):
            where = f"input[{i - self.stored}]" if i >= self.stored else self.history
            if isinstance(item, ReasoningItem):
                self._reasoning(item, i in self.own, where)
            elif isinstance(item, FunctionCallItem):
                self._assistant(where).calls.append(
                    neutral.ToolCall(item.call_id, item.name, item.arguments)
                )
            elif isinstance(item, McpCallItem | McpApprovalRequestItem):
                call_id = getattr(item, "approval_request_id", None) or item.id
                if call_id == item.id:  # not asked for approval before: the call is new
                    call = neutral.ToolCall(item.id, item.name, item.arguments)
                    self._assistant(where).calls.append(call)
                if isinstance(item, McpCallItem):
                    reply = neutral.Message("tool", item.reply(), where, tool_call_id=call_id)
                    self._replies.append(reply)  # after the turn that holds the call
            elif isinstance(item, McpApprovalResponseItem):
                if not item.approve:
                    reply = neutral.Message(
                        "tool", item.denial(), where, tool_call_id=item.approval_request_id
                    )
                    self._replies.append(reply)
            elif isinstance(item, McpListToolsItem):
                continue
            elif isinstance(item, MessageItem) and item.role == "assistant":
                if self._turn is not None and self._turn.calls:
                    self._flush()
                self._assistant(where).parts += _assistant_parts(item.content, where)
            elif isinstance(item, CompactionTrigger):
                if i != len(items) - 1:
                    raise bad_request("A compaction_trigger must be the last input item.", where)
            elif isinstance(item, CompactionItem):
                self._flush()
                if (summary := expanded(item.encrypted_content, where)) is not None:
                    self._out.append(summary)
                else:
                    log.debug("compaction at %s is not this server's; left out", where)
            else:
                self._flush()
                self._out.append(_other(item, where, self.files))
        self._flush()
        return _leading_system(instructions, self._out)

    def _reasoning(self, item: ReasoningItem, own: bool, where: str) -> None:
        turn = self._turn
        if turn is not None and (turn.parts or turn.calls):
            self._flush()
        text = _reasoning_text(item, own, where)
        if text is None:
            log.debug("reasoning at %s is not this server's; left out of the prompt", where)
        else:
            self._assistant(where).reasoning.append(text)

    def _assistant(self, where: str) -> _AssistantTurn:
        if self._turn is None:
            self._turn = _AssistantTurn(param=where)
        return self._turn

    def _flush(self) -> None:
        """The assistant turn so far, then the replies to its MCP calls."""
        turn, self._turn = self._turn, None
        if turn is not None:
            self._out.append(
                neutral.Message(
                    "assistant",
                    tuple(turn.parts),
                    turn.param,
                    tool_calls=tuple(turn.calls),
                    reasoning="\n".join(turn.reasoning) or None,
                )
            )
        self._out += self._replies
        self._replies = []


def _reasoning_text(item: ReasoningItem, own: bool, where: str) -> str | None:
    """A stored item's text is the server's own; a client's counts only when sealed here."""
    if item.encrypted_content is not None:
        return REASONING.unseal(item.encrypted_content, f"{where}.encrypted_content")
    if own:
        return "".join(part.text for part in item.content or item.summary)
    return None


def _other(item, where: str, files: FileInputs | None) -> neutral.Message:
    if isinstance(item, FunctionCallOutputItem):
        text = _text(item.output, where, "a function_call_output")
        return neutral.Message("tool", text, where, tool_call_id=item.call_id)
    if isinstance(item, OtherItem):
        raise bad_request(
            f"Input items of type '{item.type}' are not supported on this server.",
            f"{where}.type",
        )
    if item.role in ("system", "developer"):
        return neutral.Message("system", _text(item.content, where, "a system message"), where)
    return neutral.Message("user", _user_parts(item.content, where, files), where)


def _user_parts(
    content: str | list, where: str, files: FileInputs | None
) -> str | tuple[neutral.Part, ...]:
    if isinstance(content, str):
        return content
    parts: list[neutral.Part] = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if isinstance(part, InputImage):
            parts.append(neutral.ImagePart(_image_url(part, param, files), param))
        elif isinstance(part, InputAudio):
            audio = part.input_audio
            parts.append(neutral.AudioPart.inline(audio.data, audio.format, param))
        elif isinstance(part, InputFile) and files is not None:
            given = FileInput(part.file_id, part.file_data, part.file_url, part.filename)
            parts.append(files.part(given, param))
        else:
            parts.append(neutral.TextPart(_part_text(part, param, "a user message")))
    return tuple(parts)


def _assistant_parts(content: str | list, where: str) -> list[neutral.Part]:
    if isinstance(content, str):
        return [neutral.TextPart(content)]
    return [
        neutral.TextPart(_part_text(part, f"{where}.content[{j}]", "an assistant message"))
        for j, part in enumerate(content)
    ]


def _text(content: str | list, where: str, holder: str) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        _part_text(part, f"{where}.content[{j}]", holder) for j, part in enumerate(content)
    )


def _part_text(part, param: str, holder: str) -> str:
    if isinstance(part, InputText):
        return part.text
    if isinstance(part, Refusal):
        return part.refusal
    if isinstance(part, InputImage):
        raise bad_request(
            f"Images cannot stand in {holder}; send them in a user message.",
            param,
            code="images_not_supported",
        )
    if isinstance(part, InputAudio):
        raise bad_request(
            f"Audio cannot stand in {holder}; send it in a user message.",
            param,
            code="audio_not_supported",
        )
    raise bad_request(
        f"Files cannot stand in {holder}; send them in a user message.", f"{param}.type"
    )


def _image_url(part: InputImage, param: str, files: FileInputs | None) -> str:
    if part.image_url:
        return part.image_url
    if part.file_id and files is not None:
        return files.image_url(part.file_id, f"{param}.file_id")
    raise bad_request(
        "An input_image needs an 'image_url' (a URL or a data URL) or a 'file_id'.",
        f"{param}.image_url",
    )


def _leading_system(
    instructions: str | None, messages: list[neutral.Message]
) -> tuple[neutral.Message, ...]:
    """`instructions` and the system/developer messages the input opens with become one
    system message: many chat templates take a single system turn, at the start."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    texts = [instructions] if instructions else []
    texts += [m.content for m in messages[:lead] if isinstance(m.content, str) and m.content]
    if not texts:
        return tuple(messages)
    param = "instructions" if instructions else messages[0].param
    return (neutral.Message("system", "\n\n".join(texts), param), *messages[lead:])

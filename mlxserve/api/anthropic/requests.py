"""Anthropic Messages request bodies: the wire models, checked, and their translation into
the neutral chat request."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mlxserve.api.anthropic import thinking as signatures
from mlxserve.api.quirks import leave_out_hosted_tools, without_billing_header
from mlxserve.api.wire import Strict
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request

log = logging.getLogger(__name__)

# output_config.effort -> the chat template's reasoning_effort
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


class TextBlock(Strict):
    type: Literal["text"]
    text: str


class ImageSource(Strict):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def as_url(self, param: str) -> str:
        """The image as a URL the image pipeline reads: base64 data become a data URI."""
        if self.type == "url":
            if not self.url:
                raise bad_request("A url image source needs a 'url'.", param=param)
            return self.url
        if not self.data or not self.media_type:
            raise bad_request("A base64 image source needs 'media_type' and 'data'.", param=param)
        return f"data:{self.media_type};base64,{self.data}"


class ImageBlock(Strict):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolReferenceBlock(Strict):
    """A tool search's result: the tool it found (a deferred one) is loaded. Every tool is
    in the prompt from the start here (see Tool.defer_loading), so it stands as its name."""

    type: Literal["tool_reference"]
    tool_name: str


ResultPart = Annotated[TextBlock | ImageBlock | ToolReferenceBlock, Field(discriminator="type")]


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultPart] = ""
    is_error: bool = False


class McpToolUseBlock(Strict):
    """A call to an MCP server's tool that the server ran (the MCP connector)."""

    type: Literal["mcp_tool_use"]
    id: str
    name: str
    server_name: str
    input: dict


class McpToolResultBlock(Strict):
    """What the server's MCP call gave; in the assistant's turn, after its call."""

    type: Literal["mcp_tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False

    def text(self) -> str:
        text = (
            self.content
            if isinstance(self.content, str)
            else "\n".join(part.text for part in self.content)
        )
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | McpToolUseBlock
    | McpToolResultBlock,
    Field(discriminator="type"),
]


# Media the Messages API has no block for (OpenAI's dialects have parts for them)
MEDIA_BLOCKS = ("audio", "video", "input_audio", "video_url")


class Message(Strict):
    # Claude Code also sends system turns among the messages (environment notes).
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _no_media_blocks(cls, value):
        """An audio or video block is named, not lost among the union's complaints."""
        for i, block in enumerate(value if isinstance(value, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in MEDIA_BLOCKS:
                raise ValueError(
                    f"block {i} is of type '{kind}', which the Messages API does not have; "
                    "this server reads audio and video in /v1/chat/completions "
                    "(input_audio, video_url) and /v1/responses (input_audio, input_file)"
                )
        return value


class Tool(Strict):
    """A custom tool, or one of Anthropic's own (web search, code execution, a computer,
    bash...: a `type` with a version date), which is left out of the prompt: the server
    cannot run it and does not know its schema."""

    type: str | None = None
    name: str
    description: str | None = None
    input_schema: dict | None = None
    strict: bool | None = None
    # Tool search's deferral: the tool is in the prompt from the start like any other (a
    # chat template lists its tools once, before the conversation), so the model can
    # call it before a search finds it; what a search finds stands as its name.
    defer_loading: bool | None = None
    # Examples of the tool's input, shown to the model in its description.
    input_examples: list[dict] | None = None
    allowed_callers: list[str] | None = Field(
        None, description="Who may call the tool: 'direct' (the model) must be among them."
    )

    @property
    def custom(self) -> bool:
        return self.type in (None, "custom")

    @model_validator(mode="after")
    def _schema(self):
        if self.custom and self.input_schema is None:
            raise ValueError("a custom tool needs an input_schema")
        return self

    @field_validator("allowed_callers")
    @classmethod
    def _callers(cls, value: list[str] | None) -> list[str] | None:
        """A tool only code execution may call (programmatic tool calling) could never be
        called here: this server runs no code."""
        if value is not None and "direct" not in value:
            raise ValueError(
                "only code execution may call this tool, and this server runs no code: "
                "'direct' must be among its callers"
            )
        return value

    def described(self) -> str | None:
        """The description the model reads: with the input examples after it."""
        if not self.input_examples:
            return self.description
        examples = "\n".join(json.dumps(example) for example in self.input_examples)
        head = f"{self.description}\n\n" if self.description else ""
        return f"{head}Examples of input:\n{examples}"


class McpToolConfig(Strict):
    enabled: bool = True
    defer_loading: bool | None = None  # every tool is in the prompt from the start here


class McpToolset(Strict):
    """The MCP connector's tool configuration (its 2025-11-20 form): which tools of the
    server `mcp_server_name` the model is offered."""

    type: Literal["mcp_toolset"]
    mcp_server_name: str
    default_config: McpToolConfig = McpToolConfig()
    configs: dict[str, McpToolConfig] | None = None
    cache_control: dict | None = None

    def enabled(self, tool: str) -> bool:
        return (self.configs or {}).get(tool, self.default_config).enabled


def _tool_kind(value) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "McpToolset" if kind == "mcp_toolset" else "Tool"


AnyTool = Annotated[
    Annotated[Tool, Tag("Tool")] | Annotated[McpToolset, Tag("McpToolset")],
    Discriminator(_tool_kind),
]


class McpToolConfiguration(Strict):
    enabled: bool = True
    allowed_tools: list[str] | None = None


class McpServerDefinition(Strict):
    """An MCP server of the request (the MCP connector): connected for the request, where
    the server's --mcp-allow-url allows its URL."""

    type: Literal["url"]
    url: str
    name: str
    authorization_token: str | None = None
    tool_configuration: McpToolConfiguration | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    # "omitted": thinking blocks come with an empty text and a signature holding it
    # (thinking.py); "summarized" (the default): with the text, here the whole reasoning
    display: Literal["summarized", "omitted"] | None = None

    @property
    def omitted(self) -> bool:
        return self.display == "omitted"


class OutputFormat(Strict):
    """JSON outputs: the reply's text is JSON to this schema (always strict)."""

    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None
    task_budget: dict | None = Field(
        default=None, description="Task budgets: not served, anything but null is a 400."
    )

    @field_validator("task_budget")
    @classmethod
    def _task_budget(cls, value):
        """A countdown of the task's tokens that Claude models are trained to pace their
        work by: not one this server's models read."""
        if value is not None:
            raise ValueError(
                "task budgets are not served here: this server's models are not trained to "
                "pace a task by its budget's countdown"
            )
        return value


# Context editing (context.py applies it) -------------------------------------------------


class Closed(Strict):
    """A context edit's settings: a field it does not know is a 400, not a setting dropped."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Count(Closed):
    """A number of something: `input_tokens`, `tool_uses`, `thinking_turns`; or `all`."""

    type: Literal["input_tokens", "tool_uses", "thinking_turns", "all"]
    value: Annotated[int, Field(ge=0)] | None = None

    def counts(self, *kinds: str) -> Count:
        if self.type not in kinds:
            raise ValueError(f"type must be {' or '.join(repr(kind) for kind in kinds)}")
        if self.type != "all" and self.value is None:
            raise ValueError(f"a count of {self.type} needs a value")
        return self


class ClearToolUses(Closed):
    """Old tool results (and, if asked, the calls' inputs) replaced by a placeholder once
    the prompt passes `trigger`, all but the last `keep` tool uses."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: Count = Count(type="input_tokens", value=100_000)
    keep: Count = Count(type="tool_uses", value=3)
    clear_at_least: Count | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, value: Count) -> Count:
        return value.counts("input_tokens", "tool_uses")

    @field_validator("keep")
    @classmethod
    def _keep(cls, value: Count) -> Count:
        return value.counts("tool_uses")

    @field_validator("clear_at_least")
    @classmethod
    def _at_least(cls, value: Count | None) -> Count | None:
        return value and value.counts("input_tokens")


class ClearThinking(Closed):
    """Thinking blocks left out of all but the last `keep` assistant turns that have them."""

    type: Literal["clear_thinking_20251015"]
    keep: Count = Count(type="thinking_turns", value=1)

    @field_validator("keep", mode="before")
    @classmethod
    def _all(cls, value):
        return {"type": "all"} if value == "all" else value

    @field_validator("keep")
    @classmethod
    def _keep(cls, value: Count) -> Count:
        if value.type == "thinking_turns" and value.value == 0:
            raise ValueError(
                "the thinking of at least the last turn is kept: value must be 1 or more"
            )
        return value.counts("thinking_turns", "all")


# An edit's type -> its model's tag (a class name: error locations leave it out)
EDITS = {"clear_tool_uses_20250919": "ClearToolUses", "clear_thinking_20251015": "ClearThinking"}


def _edit_tag(edit) -> str | None:
    """The tag of an edit: a body's object, or a model (as it is written out)."""
    kind = edit.get("type") if isinstance(edit, dict) else getattr(edit, "type", None)
    return EDITS.get(kind) if isinstance(kind, str) else None


Edit = Annotated[
    Annotated[ClearToolUses, Tag("ClearToolUses")] | Annotated[ClearThinking, Tag("ClearThinking")],
    Discriminator(_edit_tag),
]


class ContextManagement(Closed):
    edits: list[Edit] = Field(default_factory=list)

    @field_validator("edits", mode="before")
    @classmethod
    def _served(cls, edits):
        """An edit of a type this server does not apply (server-side compaction's, a
        future one) is a 400 naming it, not an edit skipped."""
        served = " and ".join(EDITS)
        for i, edit in enumerate(edits if isinstance(edits, list) else []):
            if not isinstance(edit, dict) or "type" not in edit:
                raise ValueError(f"edits[{i}] is not an object with a type")
            if not isinstance(edit["type"], str) or edit["type"] not in EDITS:
                raise ValueError(
                    f"edits[{i}] has type {edit['type']!r}; this server applies {served}"
                )
        return edits


class CountTokensRequest(Strict):
    """What /v1/messages/count_tokens takes: the prompt-defining fields of a request."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnyTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # the structured-outputs beta's name for output_config.format
    output_format: OutputFormat | None = None
    context_management: ContextManagement | None = None

    @field_validator("thinking")
    @classmethod
    def _budget(cls, value):
        if value is not None and value.type == "enabled" and value.budget_tokens is None:
            raise ValueError("budget_tokens is required when thinking is enabled")
        return value

    @field_validator("output_format")
    @classmethod
    def _one_format(cls, value: OutputFormat | None, info: ValidationInfo):
        config = info.data.get("output_config")
        given = config.format if config is not None else None
        if value is not None and given is not None and given != value:
            raise ValueError(
                "output_format and output_config.format are two names of one setting: "
                "send one of them, or the same format in both"
            )
        return value

    def output_form(self) -> tuple[OutputFormat | None, str]:
        """The format asked for and the field that asked for it."""
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format, "output_config.format"
        return self.output_format, "output_format"


# Fields refused whenever given, and why.
UNSERVED = {
    "container": "code execution containers are not served here: this server runs no code",
    "compaction": (
        "server-side compaction is not served here: compact the conversation on the "
        "client's side (count_tokens takes compaction and counts the messages as sent, as "
        "Anthropic's does)"
    ),
    "fallback_credit_token": (
        "invalid or malformed: this server refuses no request for policy reasons, so it "
        "mints no fallback credit tokens"
    ),
}


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    mcp_servers: list[McpServerDefinition] | None = None  # the MCP connector (mcp.py)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    stream: bool = False
    metadata: dict | None = None  # accepted, unused
    service_tier: str | None = None  # accepted, unused
    container: str | dict | None = Field(
        None, description="Code execution's container: not served, anything but null is a 400."
    )
    compaction: dict | None = Field(
        None, description="Server-side compaction: not served, anything but null is a 400."
    )
    # Another model when this one declines a request for policy reasons, which none does
    # here: "default" (the model's own configuration) runs on the model alone, as it does
    # on Anthropic's models without fallbacks; a list of models is a 400, as it is there.
    fallbacks: Literal["default"] | list[dict] | None = None
    fallback_credit_token: str | dict | None = Field(
        None, description="A refused request's credit: none is ever minted here, so a 400."
    )

    @field_validator("container", "compaction", "fallback_credit_token")
    @classmethod
    def _unserved(cls, value, info: ValidationInfo):
        if value is not None:
            raise ValueError(UNSERVED[info.field_name or ""])
        return value

    @field_validator("fallbacks")
    @classmethod
    def _fallbacks(cls, value):
        if isinstance(value, list) and value:
            raise ValueError(
                "this server's models have no fallback models: they decline nothing for "
                "policy reasons ('default' runs the request on the model alone)"
            )
        return value


# Translation into the neutral request ---------------------------------------------------


def chat_request(wire: CountTokensRequest) -> neutral.ChatRequest:
    choice = wire.tool_choice
    fields: dict = {}
    if isinstance(wire, MessagesRequest):
        fields = {
            "sampling": neutral.Sampling(
                temperature=wire.temperature, top_p=wire.top_p, top_k=wire.top_k
            ),
            "max_tokens": wire.max_tokens,
            "stop": tuple(wire.stop_sequences or ()),
        }
    thinking = wire.thinking
    budget = thinking.budget_tokens if thinking and thinking.type == "enabled" else None
    output = wire.output_config or OutputConfig()
    form, form_param = wire.output_form()
    return neutral.ChatRequest(
        model=wire.model,
        messages=_system(wire.system) + _messages(wire.messages),
        tools=_tools(wire.tools or []),
        tool_choice=_tool_choice(choice, wire.tools or []),
        parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
        reasoning_effort=EFFORTS.get(output.effort) if output.effort else None,
        constraint=_constraint(form, form_param),
        template_kwargs=_thinking_switch(thinking),
        reasoning_budget=budget,
        continue_final=_prefilled(wire.messages[-1]),
        **fields,
    )


def _constraint(form: OutputFormat | None, param: str) -> neutral.Constraint | None:
    if form is None:
        return None
    return neutral.Constraint("json_schema", form.schema_, f"{param}.schema", True)


def _prefilled(last: Message) -> bool:
    """A conversation that ends with an assistant turn of text asks for its continuation."""
    blocks = [last.content] if isinstance(last.content, str) else last.content
    return last.role == "assistant" and all(isinstance(b, str | TextBlock) for b in blocks)


def _system(system: str | list[TextBlock] | None) -> tuple[neutral.Message, ...]:
    if not system:
        return ()
    text = system if isinstance(system, str) else "\n".join(block.text for block in system)
    text = without_billing_header(text)
    return (neutral.Message("system", text, "system"),) if text else ()


def _system_text(blocks: list, param: str) -> str:
    for j, block in enumerate(blocks):
        if not isinstance(block, TextBlock):
            raise bad_request(
                f"A {block.type} block cannot stand in a system message.", f"{param}.content[{j}]"
            )
    return "\n".join(block.text for block in blocks)


def _messages(messages: list[Message]) -> tuple[neutral.Message, ...]:
    out: list[neutral.Message] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if isinstance(message.content, str):
            out.append(neutral.Message(message.role, message.content, param))
        elif message.role == "system":
            out.append(neutral.Message("system", _system_text(message.content, param), param))
        elif message.role == "user":
            out += _user_turn(message.content, param)
        else:
            out += assistant_turn(message.content, param)
    return tuple(out)


def _user_turn(blocks: list, param: str) -> list[neutral.Message]:
    """Tool results become tool messages (in order); the other blocks one user message."""
    out: list[neutral.Message] = []
    parts: list[neutral.Part] = []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        if isinstance(block, ToolResultBlock):
            content = _tool_result(block, where)
            out.append(neutral.Message("tool", content, where, tool_call_id=block.tool_use_id))
        elif isinstance(block, TextBlock | ImageBlock):
            parts.append(_part(block, where))
        else:
            raise bad_request(f"A {block.type} block cannot stand in a user message.", where)
    if parts:
        out.append(neutral.Message("user", tuple(parts), param))
    return out


def _tool_result(block: ToolResultBlock, param: str) -> str:
    """A tool result as text (an error says so)."""
    if isinstance(block.content, str):
        text = block.content
    else:
        texts = []
        for k, part in enumerate(block.content):
            if isinstance(part, ImageBlock):
                raise bad_request(
                    "Images in tool results are not supported; send them in a user turn.",
                    f"{param}.content[{k}]",
                    code="images_not_supported",
                )
            texts.append(part.tool_name if isinstance(part, ToolReferenceBlock) else part.text)
        text = "\n".join(texts)
    return f"Error: {text}" if block.is_error else text


def assistant_turn(blocks: list, param: str) -> list[neutral.Message]:
    """Text, tool calls and the reasoning this server wrote (see thinking.py); an MCP
    call's result (which the server got, within the assistant's turn) ends the message so
    far and is the call's tool message."""
    out: list[neutral.Message] = []
    parts: list[neutral.Part] = []
    reasoning: list[str] = []
    calls: list[neutral.ToolCall] = []

    def flush() -> None:
        out.append(
            neutral.Message(
                "assistant",
                tuple(parts),
                param,
                tool_calls=tuple(calls),
                reasoning="\n".join(reasoning) or None,
            )
        )
        parts.clear()
        reasoning.clear()
        calls.clear()

    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        if isinstance(block, TextBlock):
            parts.append(neutral.TextPart(block.text))
        elif isinstance(block, ToolUseBlock | McpToolUseBlock):
            calls.append(neutral.ToolCall(block.id, block.name, block.input))
        elif isinstance(block, McpToolResultBlock):
            if parts or calls or reasoning:
                flush()
            out.append(neutral.Message("tool", block.text(), where, tool_call_id=block.tool_use_id))
        elif isinstance(block, ThinkingBlock):
            text = signatures.reasoning(block.thinking, block.signature, where)
            if text is not None:
                reasoning.append(text)
            else:
                log.debug("thinking at %s is not this server's; left out of the prompt", where)
        elif not isinstance(block, RedactedThinkingBlock):  # opaque: nothing to render
            raise bad_request(f"A {block.type} block cannot stand in an assistant message.", where)
    if parts or calls or reasoning or not out:
        flush()
    return out


def _part(block: TextBlock | ImageBlock, param: str) -> neutral.Part:
    if isinstance(block, TextBlock):
        return neutral.TextPart(block.text)
    return neutral.ImagePart(block.source.as_url(f"{param}.source"), param)


def _tools(tools: list) -> tuple[neutral.Tool, ...]:
    """The custom tools (an MCP toolset's are added where its server is connected)."""
    tools = [tool for tool in tools if isinstance(tool, Tool)]
    leave_out_hosted_tools([str(tool.type) for tool in tools if not tool.custom])
    return tuple(
        neutral.Tool(tool.name, tool.described(), tool.input_schema, tool.strict)
        for tool in tools
        if tool.custom
    )


def _tool_choice(choice: ToolChoice | None, tools: list) -> neutral.ToolChoice:
    if choice is None or choice.type == "auto":
        return neutral.ToolChoice("auto")
    if choice.type == "none":
        return neutral.ToolChoice("none")
    if choice.type == "any":
        return neutral.ToolChoice("required")
    if not choice.name:
        raise bad_request("A tool_choice of type 'tool' needs a 'name'.", "tool_choice.name")
    tools = [tool for tool in tools if isinstance(tool, Tool)]
    hosted = next((tool for tool in tools if tool.name == choice.name and not tool.custom), None)
    if hosted is not None:
        raise bad_request(
            f"tool_choice names '{choice.name}', a tool of type '{hosted.type}' that this "
            "server cannot run; only custom tools can be forced.",
            "tool_choice.name",
            code="unsupported_tool",
        )
    return neutral.ToolChoice("required", choice.name)


def _thinking_switch(thinking: Thinking | None) -> dict:
    """The chat template's thinking switch (Qwen3's and others' `enable_thinking`); with
    no `thinking` field the template's own default holds."""
    if thinking is None:
        return {}
    return {"enable_thinking": thinking.type != "disabled"}

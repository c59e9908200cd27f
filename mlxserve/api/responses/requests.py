"""OpenAI Responses request bodies: the wire models, checked, and their translation into the
neutral chat request (the input items themselves are translated in conversation.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mlxserve.api.quirks import leave_out_hosted_tools
from mlxserve.api.responses.conversation import CompactionTrigger, Conversation, InputItem
from mlxserve.api.responses.files import FileInputs
from mlxserve.api.responses.mcp import McpRound, McpToolSpec
from mlxserve.api.wire import (
    Strict,
    ToolCallGrammar,
    Verbosity,
    as_written,
    check_tool_choice,
    tool_choice,
)
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request

# reasoning.effort -> the chat template's reasoning_effort ("none" turns thinking off)
EFFORTS = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
ENCRYPTED_REASONING = "reasoning.encrypted_content"
LOGPROBS = "message.output_text.logprobs"
# What `include` may ask for: the encrypted reasoning and the logprobs change a reply; the
# others name outputs of hosted tools and inputs, which this server never returns.
INCLUDABLE = (
    ENCRYPTED_REASONING,
    LOGPROBS,
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
)


class FunctionTool(Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamespaceTool(Strict):
    """A group of function tools (Codex sends its sub-agent tools so); its functions are
    offered to the model by their own names, and their calls name the namespace."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[FunctionTool]


class HostedTool(Strict):
    """Any other tool: one the server would have to run itself (web search, file search, a
    computer...) or a free-form custom tool: left out of the prompt (see api/quirks.py)."""

    type: str
    name: str | None = None


def _tool_kind(value) -> str:
    """The tool's model; tags are the models' names, which error locations leave out."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    known = {"function": "FunctionTool", "namespace": "NamespaceTool", "mcp": "McpToolSpec"}
    return known.get(str(kind), "HostedTool")


Tool = Annotated[
    Annotated[FunctionTool, Tag("FunctionTool")]
    | Annotated[NamespaceTool, Tag("NamespaceTool")]
    | Annotated[McpToolSpec, Tag("McpToolSpec")]
    | Annotated[HostedTool, Tag("HostedTool")],
    Discriminator(_tool_kind),
]


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Verbosity | None = None

    _as_written = field_validator("verbosity")(as_written)


Summary = Literal["auto", "concise", "detailed"]
# OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


class ReasoningConfig(Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None  # the older name of `summary`
    # Which turns' reasoning the model sees again: the chat template decides ("auto").
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = None  # OpenAI's execution modes: one ("standard") here

    @field_validator("context")
    @classmethod
    def _template_decides(cls, value):
        if value not in (None, "auto"):
            raise ValueError(
                "only 'auto' is served: the model's chat template decides which turns' "
                "reasoning it renders"
            )
        return value

    @field_validator("mode")
    @classmethod
    def _standard(cls, value):
        if value not in (None, "standard"):
            raise ValueError("only 'standard' is served: the model runs one way here")
        return value


class ConversationRef(Strict):
    id: str


class ImageOptions(Strict):
    # The server never compresses an image's context: "auto" and "disabled" are what it does.
    context_compression: Literal["auto", "enabled", "disabled"] | None = None

    @field_validator("context_compression")
    @classmethod
    def _uncompressed(cls, value):
        if value == "enabled":
            raise ValueError("is not served: images reach the model as its processor reads them")
        return value


class PromptCacheOptions(Strict):
    """Caching hints (`mode`, `ttl`, `comparison_response_id`) change nothing in a reply and
    are ignored; `prewarm` asks for a response without output."""

    prewarm: bool = False

    @field_validator("prewarm")
    @classmethod
    def _no_prewarm(cls, value):
        if value:
            raise ValueError(
                "is not served: a response here always answers (the prompt cache fills as "
                "it is computed); leave it false"
            )
        return value


class StreamOptions(Strict):
    # Obfuscation pads delta events with random characters against a network side channel;
    # this server sends none, as `false` asks, and `true` changes no text.
    include_obfuscation: bool = True


# The validation context of a WebSocket warm-up (`generate: false`), which may have no input.
WARMUP = "warmup"


# Fields of OpenAI's that would change the reply and that this server has not: a 400 naming
# them whenever they ask for something, and why.
UNSERVED = {
    "background": "background responses are not supported; leave it false",
    "prompt": "is not supported on this server; send the input itself",
    "moderation": "is not served: this server runs no moderation model",
    "context_management": (
        "is not served: compact a conversation with POST /v1/responses/compact or a "
        "compaction_trigger input item"
    ),
}


class ResponsesRequest(Strict):
    model: str | None = None
    input: list[InputItem] | str  # the list first: its errors are the ones worth naming
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    tool_call_grammar: ToolCallGrammar | None = None  # ours: "off" leaves calls unguided
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None  # bounds MCP calls (mcp.md)
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    previous_response_id: str | None = None
    store: bool = True
    include: list[Literal[INCLUDABLE]] | None = None  # type: ignore[valid-type]
    truncation: Literal["auto", "disabled"] = "disabled"
    metadata: Metadata | None = None
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    background: bool = False
    conversation: str | ConversationRef | None = None
    prompt: dict | None = None
    image: ImageOptions | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    moderation: dict | None = None
    context_management: list[dict] | None = None
    # Accepted and unused: routing, caching and abuse-detection hints of OpenAI's platform,
    # which change nothing in a reply (as do `access_programs`, `background_options` and
    # `prompt_cache_retention`, left unread).
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data):
        """OpenAI's reference marks these fields nullable: null is the default, as some
        clients send every field they have."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        shape = "only {'type': 'function', 'name': ...} can name a tool on this server"
        return check_tool_choice(value, lambda choice: choice.get("name"), shape)

    @field_validator(*UNSERVED)
    @classmethod
    def _unserved(cls, value, info: ValidationInfo):
        if value not in (None, False, []):  # what asks for nothing
            raise ValueError(UNSERVED[info.field_name or ""])
        return value

    @property
    def conversation_id(self) -> str | None:
        conversation = self.conversation
        return conversation.id if isinstance(conversation, ConversationRef) else conversation

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value, info: ValidationInfo):
        """Empty only where nothing is answered: a WebSocket warm-up (`generate: false`)
        readies the instructions and tools before the first message."""
        warmup = (info.context or {}).get(WARMUP, False)
        if isinstance(value, list) and not value and not warmup:
            raise ValueError("must not be empty")
        return value

    @property
    def compaction_triggered(self) -> bool:
        """The input ends with a compaction_trigger: the reply is its compaction."""
        return bool(self.input) and isinstance(self.input[-1], CompactionTrigger)

    @property
    def summary(self) -> Summary | None:
        reasoning = self.reasoning
        return reasoning.summary or reasoning.generate_summary if reasoning else None

    @property
    def encrypted_reasoning(self) -> bool:
        return ENCRYPTED_REASONING in (self.include or ())

    @property
    def logprobs(self) -> int | None:
        """None: no logprobs; k: the chosen token's and the k likeliest."""
        return (self.top_logprobs or 0) if LOGPROBS in (self.include or ()) else None

    @property
    def namespaces(self) -> dict[str, str]:
        """A namespaced function's name -> its namespace."""
        return {
            tool.name: space.name
            for space in self.tools or []
            if isinstance(space, NamespaceTool)
            for tool in space.tools
        }


class Resolved(ResponsesRequest):
    """A request whose item references were replaced by the stored items they name."""

    # input index -> the stored item a reference there stood for
    referenced: dict[int, dict] = Field(default_factory=dict)


# Translation into the neutral request ---------------------------------------------------


def chat_request(
    wire: Resolved,
    history: list[InputItem],
    files: FileInputs | None = None,
    warmup: bool = False,
    mcp: McpRound | None = None,
) -> neutral.ChatRequest:
    """`history`: the items of the stored responses `previous_response_id` continues, or
    of the conversation. `warmup`: a WebSocket's `generate: false`, which answers nothing
    and may hold the instructions alone. `mcp`: the MCP tools offered, and the items of
    this response's earlier rounds (its calls and their outputs), after the input."""
    items = [*history, *([] if isinstance(wire.input, str) else wire.input)]
    own = frozenset(range(len(history))) | {len(history) + i for i in wire.referenced}
    field = "conversation" if wire.conversation is not None else "previous_response_id"
    conversation = Conversation(stored=len(history), own=own, history=field, files=files)
    messages = conversation.messages(items, wire.instructions)
    if isinstance(wire.input, str):
        messages += (neutral.Message("user", wire.input, "input"),)
    if mcp is not None:
        messages += mcp.messages()
    if not warmup and not any(m.role != "system" for m in messages):
        raise bad_request("The input holds no message for the model to answer.", "input")
    reasoning = wire.reasoning
    effort = reasoning.effort if reasoning else None
    return neutral.ChatRequest(
        model=wire.model,
        sampling=neutral.Sampling(temperature=wire.temperature, top_p=wire.top_p),
        max_tokens=wire.max_output_tokens,
        max_tokens_param="max_output_tokens",
        constraint=_constraint(wire.text),
        logprobs=wire.logprobs,
        messages=messages,
        messages_param="input",
        tools=_tools(wire.tools or []) + (mcp.tools if mcp else ()),
        tool_choice=_tool_choice(wire.tool_choice, wire.tools or [], mcp),
        parallel_tool_calls=wire.parallel_tool_calls,
        reasoning_effort=EFFORTS.get(effort) if effort else None,
        template_kwargs={"enable_thinking": False} if effort == "none" else {},
        drop_oldest_to_fit=wire.truncation == "auto",
        guide_tool_calls=wire.tool_call_grammar != "off",
    )


def _tools(tools: list) -> tuple[neutral.Tool, ...]:
    leave_out_hosted_tools([tool.type for tool in tools if isinstance(tool, HostedTool)])
    out: dict[str, neutral.Tool] = {}
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if isinstance(tool, HostedTool | McpToolSpec):
            continue
        functions = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        for j, function in enumerate(functions):
            where = f"{param}.tools[{j}]" if isinstance(tool, NamespaceTool) else param
            if function.name in out:
                raise bad_request(f"Two tools are named '{function.name}'.", f"{where}.name")
            out[function.name] = neutral.Tool(
                function.name, function.description, function.parameters, function.strict
            )
    return tuple(out.values())


def _tool_choice(
    choice: str | dict | None, tools: list, mcp: McpRound | None = None
) -> neutral.ToolChoice:
    """A named function must be one this server runs, not a hosted tool. Once a turn has
    made its `max_tool_calls`, the model answers."""
    if mcp is not None and mcp.exhausted:
        choice = "none"
    if isinstance(choice, dict):
        name = choice["name"]
        hosted = [t for t in tools if isinstance(t, HostedTool) and name in (t.name, t.type)]
        if hosted:
            raise bad_request(
                f"tool_choice names '{name}', a tool of type '{hosted[0].type}' that this "
                "server cannot run; only function tools can be forced.",
                "tool_choice",
                code="unsupported_tool",
            )
    return tool_choice(choice, lambda named: named["name"])


def _constraint(text: TextConfig | None) -> neutral.Constraint | None:
    """text.format: JSON output, to a schema or any object."""
    form = text.format if text else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return neutral.Constraint("json_schema", {"type": "object"}, "text.format")
    if not form.name:
        raise bad_request("A json_schema format needs a 'name'.", "text.format.name")
    if form.schema_ is None:
        raise bad_request("A json_schema format needs a 'schema'.", "text.format.schema")
    return neutral.Constraint(
        "json_schema", form.schema_, "text.format.schema", strict=bool(form.strict)
    )

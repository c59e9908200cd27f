"""OpenAI request bodies (Chat Completions, Completions): the wire models, checked, and
their translation into the neutral requests."""

from __future__ import annotations

import json
import mimetypes
import re
from dataclasses import replace
from typing import Annotated, Any, Literal, cast

from pydantic import Field, ValidationInfo, field_validator, model_validator

from mlxserve.api.wire import Strict as _Strict
from mlxserve.api.wire import (
    ToolCallGrammar,
    Verbosity,
    as_written,
    check_tool_choice,
    tool_choice,
)
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request
from mlxserve.structured.lark import MAX_CHOICES

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TEXT_PARTS = ("text", "input_text")
IMAGE_PARTS = ("image_url", "input_image", "image")


class StreamOptions(_Strict):
    include_usage: bool = False


class ImageURL(_Strict):
    url: str
    detail: str | None = None  # accepted; the model's processor decides the resolution


class VideoURL(_Strict):
    url: str
    fps: Annotated[float, Field(gt=0)] | None = None  # frames sampled a second


class InputAudio(_Strict):
    data: str  # base64
    format: str  # wav, mp3 (OpenAI's two); anything PyAV decodes is read


class FileData(_Strict):
    file_data: str | None = None  # a data URL, or bare base64 named by `filename`
    file_id: str | None = None
    filename: str | None = None


class ContentPart(_Strict):
    type: str
    text: str | None = None
    # Chat Completions: {"url", "detail"}; Responses-style input_image: the URL itself.
    image_url: ImageURL | str | None = None
    image: str | None = None  # {"type": "image", "image": URL}, as some clients send
    video_url: VideoURL | str | None = None  # vLLM's video part
    input_audio: InputAudio | None = None
    file: FileData | None = None

    @property
    def url(self) -> str:
        if isinstance(self.image_url, ImageURL):
            return self.image_url.url
        return self.image_url or self.image or ""


class FunctionCall(_Strict):
    name: str
    arguments: str | dict = "{}"


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _properties(cls, value):
        if value is not None and not isinstance(value.get("properties", {}), dict):
            raise ValueError("'properties' must be an object")
        return value


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


# Arguments of the template call itself, which chat_template_kwargs must not replace.
RESERVED_TEMPLATE_KWARGS = {
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "return_dict",
    "return_tensors",
    "padding",
    "truncation",
    "max_length",
}


class Message(_Strict):
    # "function": a result of OpenAI's older function calling (`functions`)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None  # the older functions' call, in an assistant turn
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    thinking: str | None = None


class JsonSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Guided(_Strict):
    """vLLM's constrained-decoding fields, at the top level or inside `extra_body`."""

    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICES)] | None = None

    @field_validator("guided_json")
    @classmethod
    def _json_schema(cls, value):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"is not valid JSON: {e}") from e
            if not isinstance(value, dict):
                raise ValueError("must be a JSON schema object")
        return value


class GenerationRequest(Guided):
    """Fields shared by chat and text completions."""

    model: str | None = None
    # mlx_lm.server's per-request adapter: a served adapter's folder (or its name)
    adapters: Annotated[str, Field(min_length=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Probability | None = None
    xtc_probability: Probability | None = None
    xtc_threshold: Annotated[float, Field(ge=0.0, le=0.5)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    # Bounded: a window past any context is meaningless, and a huge one failed the whole
    # batch's decode step (every request in flight got an error).
    repetition_context_size: Annotated[int, Field(ge=1, le=1 << 20)] = 20
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    user: str | None = None
    response_format: ResponseFormat | None = None
    extra_body: Guided | None = None

    @field_validator("stop")
    @classmethod
    def _stop_words(cls, value):
        words = [value] if isinstance(value, str) else value or []
        if len(words) > 16:
            raise ValueError("at most 16 stop sequences are allowed")
        if any(word == "" for word in words):
            raise ValueError("stop sequences must not be empty")
        return words

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value):
        if value and not all(re.fullmatch(r"\d+", key) for key in value):
            raise ValueError("keys must be token ids")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(GenerationRequest):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    tool_call_grammar: ToolCallGrammar | None = None  # ours: "off" leaves calls unguided
    # OpenAI's older function calling (Dify's "Function Call" mode): tools by another name,
    # answered in the older shape (`message.function_call`, finish_reason "function_call")
    functions: list[FunctionDefinition] | None = None
    function_call: str | dict | None = None
    chat_template_kwargs: dict | None = None
    # vLLM's: its "fps" samples every video part that names no rate of its own
    mm_processor_kwargs: dict | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    thinking: bool | dict | None = None
    # OpenAI fields that would change the reply and that this server cannot serve: a 400
    # naming them, never dropped silently (a null is the default, as clients send it).
    audio: dict | None = None
    modalities: list[str] | None = None
    web_search_options: dict | None = None
    verbosity: Verbosity | None = None

    _as_written = field_validator("verbosity")(as_written)

    @field_validator("audio", "web_search_options")
    @classmethod
    def _not_served(cls, value, info: ValidationInfo):
        if value is not None:
            reason = {"audio": "spoken replies", "web_search_options": "web search"}
            raise ValueError(f"is not served: this server has no {reason[str(info.field_name)]}")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value):
        if value is not None and set(value) - {"text"}:
            raise ValueError("only ['text'] is served: this server does not speak its replies")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("requires logprobs to be true")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        shape = "must be {'type': 'function', 'function': {'name': ...}}"
        return check_tool_choice(value, _function_name, shape)

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, value):
        if isinstance(value, dict) and not isinstance(value.get("name"), str):
            raise ValueError("must be 'auto', 'none' or {'name': ...}")
        if isinstance(value, str) and value not in ("auto", "none"):
            raise ValueError("must be 'auto', 'none' or {'name': ...}")
        return value

    @model_validator(mode="after")
    def _tools_or_functions(self):
        if self.functions is not None and self.tools is not None:
            raise ValueError("give tools or functions (the older form), not both")
        return self

    @property
    def legacy_functions(self) -> bool:
        """Whether the request uses the older function calling (and wants its replies)."""
        return self.functions is not None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value):
        if value and (reserved := sorted(RESERVED_TEMPLATE_KWARGS & set(value))):
            raise ValueError(f"{', '.join(reserved)} cannot be set here")
        return value

    @field_validator("reasoning_effort")
    @classmethod
    def _effort(cls, value):
        if value is not None and value.lower() not in ("low", "medium", "high"):
            raise ValueError("must be 'low', 'medium' or 'high'")
        return value.lower() if value else value

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def token_limit_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    @property
    def logprob_count(self) -> int | None:
        """None: no logprobs; 0: the chosen token's; k: also the k most likely."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Fill in the middle: the prompt is the code before the cursor, `suffix` after it
    suffix: str | None = None
    echo: bool = False  # not served: a 400 (the prompt is not repeated in the reply)
    # OpenAI's server generates best_of candidates and returns the n most likely: served
    # where that is every candidate (best_of == n); this server does not rank candidates
    best_of: Annotated[int, Field(ge=1, le=16)] | None = None

    @field_validator("best_of")
    @classmethod
    def _no_ranking(cls, value, info: ValidationInfo):
        n = info.data.get("n", 1)
        if value is not None and value < n:
            raise ValueError("best_of must be at least n")
        if value is not None and value > n:
            raise ValueError(
                "best_of greater than n is not served: this server does not rank candidates"
            )
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        if value:
            raise ValueError(
                "echo is not served: the reply holds the completion only (and, with "
                "suffix, the middle only)"
            )
        return value

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value):
        if isinstance(value, list) and (
            not value or any(len(p) == 0 for p in value if isinstance(p, list))
        ):
            raise ValueError("prompt must not be empty")
        return value

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs


class ModelRequest(_Strict):
    """The body of /v1/models/load and /v1/models/unload."""

    model: Annotated[str, Field(min_length=1)]


class PinRequest(ModelRequest):
    """The body of /v1/models/pin: pin (never unload for memory or idleness) or unpin."""

    pinned: bool = True


class AdapterLoad(_Strict):
    """The body of /v1/adapters/load: serve the adapter folder `path` as `name`, on the
    served model `model` (default: the first)."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    path: Annotated[str, Field(min_length=1, pattern=r"^[^\x00]+$")]  # no NUL: a file path
    model: Annotated[str, Field(min_length=1)] | None = None


class AdapterUnload(_Strict):
    """The body of /v1/adapters/unload: stop serving the adapter `name`."""

    name: Annotated[str, Field(min_length=1)]


# Translation into the neutral requests ------------------------------------------------


def chat_request(wire: ChatRequest) -> neutral.ChatRequest:
    functions = wire.functions or [tool.function for tool in wire.tools or []]
    return neutral.ChatRequest(
        **_generation_fields(wire, wire.token_limit),
        max_tokens_param=wire.token_limit_param,
        messages=_video_rate(_messages(wire.messages), wire.mm_processor_kwargs),
        tools=tuple(neutral.Tool(f.name, f.description, f.parameters, f.strict) for f in functions),
        tool_choice=_legacy_choice(wire.function_call)
        if wire.legacy_functions
        else tool_choice(wire.tool_choice, _function_name),
        # the older form answers one function_call a reply
        parallel_tool_calls=wire.parallel_tool_calls and not wire.legacy_functions,
        reasoning_effort=wire.reasoning_effort,
        template_kwargs=_template_kwargs(wire),
        guide_tool_calls=wire.tool_call_grammar != "off",
    )


def completion_request(wire: CompletionRequest) -> neutral.CompletionRequest:
    given = wire.prompt
    prompts = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else given
    return neutral.CompletionRequest(
        **_generation_fields(wire, wire.max_tokens),
        prompts=tuple(p if isinstance(p, str) else tuple(cast(list[int], p)) for p in prompts),
        infill=neutral.Infill(wire.suffix) if wire.suffix is not None else None,
    )


def _generation_fields(wire: ChatRequest | CompletionRequest, max_tokens: int | None) -> dict:
    return {
        "model": wire.model,
        "adapter": wire.adapters,
        "sampling": neutral.Sampling(
            temperature=wire.temperature,
            top_p=wire.top_p,
            top_k=wire.top_k,
            min_p=wire.min_p,
            xtc_probability=wire.xtc_probability,
            xtc_threshold=wire.xtc_threshold,
            repetition_penalty=wire.repetition_penalty,
            repetition_context_size=wire.repetition_context_size,
            presence_penalty=wire.presence_penalty,
            frequency_penalty=wire.frequency_penalty,
            logit_bias={int(k): v for k, v in (wire.logit_bias or {}).items()},
            seed=wire.seed,
        ),
        "max_tokens": max_tokens,
        "stop": tuple(wire.stop or ()),
        "n": wire.n,
        "logprobs": wire.logprob_count,
        "constraint": _constraint(wire),
    }


def _messages(messages: list[Message]) -> tuple[neutral.Message, ...]:
    """Each message as the neutral one; an older `function_call` is a tool call with an
    id, and a `function` message the result of the call it follows (named alike, else
    the earliest unanswered)."""
    out = []
    unanswered: list[neutral.ToolCall] = []
    for i, message in enumerate(messages):
        converted = _message(message, f"messages[{i}]")
        if message.function_call is not None:
            call = message.function_call
            legacy = neutral.ToolCall(f"call_{i}", call.name, call.arguments)
            converted = replace(converted, tool_calls=(*converted.tool_calls, legacy))
        if converted.tool_calls:
            unanswered = list(converted.tool_calls)
        if message.role == "function":
            answered = next((c for c in unanswered if c.name == message.name), None)
            answered = answered or (unanswered[0] if unanswered else None)
            if answered is not None:
                unanswered.remove(answered)
            call_id = answered.id if answered is not None else None
            converted = replace(converted, role="tool", tool_call_id=call_id)
        out.append(converted)
    return tuple(out)


def _message(message: Message, param: str) -> neutral.Message:
    role = message.role
    return neutral.Message(
        role="system" if role == "developer" else "tool" if role == "function" else role,
        content=_content(message.content, param),
        param=param,
        name=message.name,
        tool_calls=tuple(
            neutral.ToolCall(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or []
        ),
        tool_call_id=message.tool_call_id,
        reasoning=message.reasoning_content or message.reasoning or message.thinking,
    )


def _legacy_choice(value: str | dict | None) -> neutral.ToolChoice:
    """The older function_call as the neutral tool choice."""
    if isinstance(value, dict):
        return neutral.ToolChoice("required", value["name"], "function_call")
    return neutral.ToolChoice("none" if value == "none" else "auto", param="function_call")


def _content(content: str | list[ContentPart] | None, param: str):
    if not isinstance(content, list):
        return content
    parts: list[neutral.Part] = []
    for j, part in enumerate(content):
        where = f"{param}.content[{j}]"
        if part.type in TEXT_PARTS:
            if part.text is None:
                raise bad_request("A text content part needs a 'text' string.", param=where)
            parts.append(neutral.TextPart(part.text))
        elif part.type in IMAGE_PARTS:
            parts.append(neutral.ImagePart(part.url, where))
        elif part.type == "video_url":
            parts.append(_video(part.video_url, where))
        elif part.type == "input_audio":
            parts.append(_audio(part.input_audio, where))
        elif part.type == "file":
            parts.append(_file(part.file, where))
        else:
            raise bad_request(f"Unsupported content part type '{part.type}'.", param=where)
    return tuple(parts)


def _video_rate(
    messages: tuple[neutral.Message, ...], kwargs: dict | None
) -> tuple[neutral.Message, ...]:
    """The messages with vLLM's `mm_processor_kwargs.fps` given to each video part that
    names no rate of its own."""
    fps = (kwargs or {}).get("fps")
    if fps is None:
        return messages
    if isinstance(fps, bool) or not isinstance(fps, int | float) or fps <= 0:
        raise bad_request("fps must be a positive number.", param="mm_processor_kwargs.fps")

    def rated(part: neutral.Part) -> neutral.Part:
        if isinstance(part, neutral.VideoPart) and part.fps is None:
            return replace(part, fps=float(fps))
        return part

    return tuple(
        replace(m, content=tuple(map(rated, m.content))) if isinstance(m.content, tuple) else m
        for m in messages
    )


def _video(given: VideoURL | str | None, param: str) -> neutral.VideoPart:
    if given is None:
        raise bad_request("A video_url part needs a 'video_url' object.", param=param)
    if isinstance(given, str):
        return neutral.VideoPart(given, param)
    return neutral.VideoPart(given.url, param, given.fps)


def _audio(given: InputAudio | None, param: str) -> neutral.AudioPart:
    if given is None:
        raise bad_request("An input_audio part needs an 'input_audio' object.", param=param)
    return neutral.AudioPart.inline(given.data, given.format, param)


def _file(given: FileData | None, param: str) -> neutral.Part:
    """A file part holding an image, a video or an audio clip (as its type or name says)."""
    if given is None or given.file_data is None:
        raise bad_request(
            "A file part is read from its 'file_data' (a data URL); file_id is not read in "
            "Chat Completions (the Responses API reads uploaded files).",
            param=param,
        )
    data = given.file_data
    if not data.startswith("data:"):
        named = mimetypes.guess_type(given.filename or "", strict=False)[0]
        data = f"data:{named or 'application/octet-stream'};base64,{data}"
    mime_type = data.removeprefix("data:").split(";")[0]
    part = neutral.media_part(mime_type, data, param)
    if part is None:
        raise bad_request(
            f"A file part holds an image, a video or an audio clip on this server, not "
            f"'{mime_type}'.",
            param=param,
            code="unsupported_file",
        )
    return part


def _function_name(choice: dict) -> Any:
    """Chat's named tool_choice: {"type": "function", "function": {"name": ...}}."""
    function = choice.get("function")
    return function.get("name") if isinstance(function, dict) else None


def _template_kwargs(wire: ChatRequest) -> dict:
    """What the request tells the chat template besides the messages and tools."""
    kwargs: dict = {}
    if wire.enable_thinking is not None:
        kwargs["enable_thinking"] = wire.enable_thinking
    if wire.thinking is not None:
        kwargs["thinking"] = wire.thinking
    return {**kwargs, **(wire.chat_template_kwargs or {})}


def _constraint(wire: GenerationRequest) -> neutral.Constraint | None:
    """The one content constraint of response_format and vLLM's guided_* fields."""
    found: list[neutral.Constraint] = []
    response_format = wire.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(neutral.Constraint("json_schema", {"type": "object"}, "response_format"))
    elif response_format is not None and response_format.type == "json_schema":
        if response_format.json_schema is None:
            raise bad_request(
                "response_format of type 'json_schema' needs a 'json_schema' object.",
                param="response_format.json_schema",
            )
        form = response_format.json_schema
        param = "response_format.json_schema.schema"
        schema = form.schema_ or {"type": "object"}
        found.append(neutral.Constraint("json_schema", schema, param, strict=bool(form.strict)))
    for prefix, source in (("", wire), ("extra_body.", wire.extra_body)):
        if source is None:
            continue
        guided: tuple[tuple[neutral.ConstraintKind, str, Any], ...] = (
            ("json_schema", "guided_json", source.guided_json),
            ("regex", "guided_regex", source.guided_regex),
            ("choice", "guided_choice", source.guided_choice),
        )
        for kind, name, value in guided:
            if value is not None:
                found.append(neutral.Constraint(kind, value, prefix + name))
    if len(found) > 1:
        raise bad_request(
            f"Only one constraint may be given; got {', '.join(c.param for c in found)}.",
            param=found[1].param,
        )
    return found[0] if found else None

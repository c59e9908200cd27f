"""Request bodies: JSON -> validated models, so every mistake is a 400 before generation.

Pydantic in strict mode does the checking: a string where a number belongs is refused
(as OpenAI does), an int is fine where a float belongs, unknown fields are ignored.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mlxserve.api.errors import APIError, bad_request

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class ImageURL(_Strict):
    url: str
    detail: str | None = None  # accepted; the model's processor decides the resolution


class ContentPart(_Strict):
    type: str
    text: str | None = None
    # Chat Completions: {"url", "detail"}; Responses-style input_image: the URL itself.
    image_url: ImageURL | str | None = None
    image: str | None = None  # {"type": "image", "image": URL}, as some clients send

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
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
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
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None

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
    repetition_context_size: Annotated[int, Field(ge=1)] = 20
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
    chat_template_kwargs: dict | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    thinking: bool | dict | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("requires logprobs to be true")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        if isinstance(value, dict):
            function = value.get("function")
            if value.get("type") != "function" or not isinstance(function, dict):
                raise ValueError("must be {'type': 'function', 'function': {'name': ...}}")
            if not isinstance(function.get("name"), str):
                raise ValueError("function.name must be a string")
        elif value not in (None, "auto", "none", "required"):
            raise ValueError("must be 'auto', 'none', 'required' or a named function")
        return value

    @property
    def forced_tool(self) -> str | None:
        """The function tool_choice names, if it names one."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value):
        if value and (reserved := sorted(RESERVED_TEMPLATE_KWARGS & set(value))):
            raise ValueError(f"{', '.join(reserved)} cannot be set here")
        return value

    @property
    def tool_definitions(self) -> list[dict] | None:
        """The tools as chat templates and parsers take them, unless tool_choice is none."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

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
    def logprob_count(self) -> int | None:
        """None: no logprobs; 0: the chosen token's; k: also the k most likely."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

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


# Pydantic names union members in error locations ('str', 'list[str]', 'ContentPart'...).
_TYPE_TAG = re.compile(r"^([A-Z]\w*|str|int|float|bool|dict|list|function-\w+)(\[.*\])?$")


def _param(loc: tuple) -> str:
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _TYPE_TAG.match(part):
            param += f".{part}" if param else part
    return param


def parse_json_body(raw: bytes) -> dict:
    """Decode a body into a JSON object, or raise a 400."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"The request body is not valid UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    try:  # JSON may escape lone UTF-16 surrogates ("\ud800"), which are not Unicode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"The request body is not valid Unicode: {e.reason}.") from e
    return body


def validate(model: type[BaseModel], body: dict) -> Any:
    """Validate a decoded body into `model`, turning the first problem into a 400."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        param = _param(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        raise APIError(400, f"Invalid value for '{param}': {message}.", param=param) from e

"""Ollama's request bodies (its docs/api.md, field by field), checked: a wrong type or
range is a 400 naming the field. Unknown fields are ignored, as Ollama ignores them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from mlxserve.api.wire import Strict

ThinkLevel = Literal["low", "medium", "high", "max"]
# keep_alive: seconds (a number), a Go duration ("5m", "1h30m", "0"), or nothing
KeepAlive = float | str | None


class FunctionCall(Strict):
    name: str
    arguments: dict = Field(default_factory=dict)
    index: int | None = None


class ToolCall(Strict):
    id: str | None = None
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None  # base64, no data: prefix
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # a tool message: the tool that answered
    tool_call_id: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        """Ollama lower-cases roles as it reads them."""
        return value.lower() if isinstance(value, str) else value


class FunctionDefinition(Strict):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict | None = None


class Tool(Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _Generation(Strict):
    """What /api/chat and /api/generate share."""

    model: str = ""
    think: bool | ThinkLevel | None = None
    format: str | dict | None = None  # "json", or a JSON schema
    options: dict | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] = 0
    # true: the oldest turns are left out of a prompt over the context (the last turn loses
    # its start where it alone does not fit); left out or false, such a prompt is a 400
    truncate: bool | None = None
    shift: bool | None = None  # accepted: a reply that fills the context ends there

    @field_validator("format")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("json", ""):
            raise ValueError('must be "json" or a JSON schema')
        return value


class ChatRequest(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    # Ollama's image generation (an image model's size and steps): not served on this
    # route (POST /v1/images/generations serves it); 0, the default, asks for nothing.
    width: int | None = None
    height: int | None = None
    steps: int | None = None

    @field_validator("width", "height", "steps")
    @classmethod
    def _no_images_out(cls, value):
        if value:
            raise ValueError(
                "image generation through /api/generate is not served: use POST "
                "/v1/images/generations"
            )
        return value

    @model_validator(mode="after")
    def _raw(self):
        if self.raw and (self.template or self.system or self.context):
            raise ValueError("raw mode does not support template, system, or context")
        return self


class EmbedRequest(Strict):
    model: str = ""
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None
    keep_alive: KeepAlive = None
    options: dict | None = None


class EmbeddingsRequest(Strict):
    """The older /api/embeddings: one prompt, one vector."""

    model: str = ""
    prompt: str = ""
    keep_alive: KeepAlive = None
    options: dict | None = None


class _Named(Strict):
    """A model named by `model`, or by `name` as older clients send it."""

    model: str = ""
    name: str = ""

    @property
    def named(self) -> str:
        return self.model or self.name


class ShowRequest(_Named):
    verbose: bool = False


class PullRequest(_Named):
    insecure: bool = False  # accepted: the hub is reached as `mlxserve pull` reaches it
    stream: bool = True


class DeleteRequest(_Named):
    pass


class CopyRequest(Strict):
    source: str = ""
    destination: str = ""


class CreateRequest(_Named):
    from_: str = Field("", alias="from")
    system: str | None = None
    template: str | None = None
    parameters: dict | None = None
    adapters: dict[str, str] | None = None
    messages: list[Message] | None = None
    license: str | list[str] | None = None
    files: dict[str, str] | None = None
    quantize: str | None = None
    stream: bool = True

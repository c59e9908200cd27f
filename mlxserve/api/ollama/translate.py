"""Ollama's chat, generate and embed requests as the neutral requests every dialect runs."""

from __future__ import annotations

import base64
import binascii

from mlxserve.api.ollama.options import Options
from mlxserve.api.ollama.requests import (
    ChatRequest,
    GenerateRequest,
    Message,
    _Generation,
)
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request

# Ollama's think levels as the chat templates' reasoning_effort ("max" is Ollama's highest)
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
# An image's first bytes -> its media type (Ollama's images are bare base64)
SIGNATURES = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
    (b"BM", "image/bmp"),
)


def chat_request(wire: ChatRequest, model: str, options: Options) -> neutral.ChatRequest:
    messages = _messages(wire.messages)
    return neutral.ChatRequest(
        **_generation_fields(wire, model, options),
        **_thinking(wire.think),
        drop_oldest_to_fit=wire.truncate is True,
        messages=messages,
        tools=tuple(
            neutral.Tool(t.function.name, t.function.description, _schema(t.function.parameters))
            for t in wire.tools or []
        ),
    )


def generate_chat(wire: GenerateRequest, model: str, options: Options) -> neutral.ChatRequest:
    """/api/generate through the chat template: the system and the prompt (with its
    images) as one exchange."""
    system = (neutral.Message("system", wire.system, "system"),) if wire.system else ()
    user = neutral.Message("user", _content(wire.prompt, wire.images, "images"), "prompt")
    return neutral.ChatRequest(
        **_generation_fields(wire, model, options),
        **_thinking(wire.think),
        drop_oldest_to_fit=wire.truncate is True,
        messages=(*system, user),
        messages_param="prompt",
    )


def generate_completion(
    wire: GenerateRequest, model: str, options: Options, prompt: str | tuple[int, ...]
) -> neutral.CompletionRequest:
    """/api/generate without the template: a raw prompt, a continued `context`, or a
    fill-in-the-middle (`suffix`)."""
    infill = neutral.Infill(wire.suffix) if wire.suffix is not None else None
    fields = _generation_fields(wire, model, options)
    return neutral.CompletionRequest(**fields, prompts=(prompt,), infill=infill)


def _generation_fields(wire: _Generation, model: str, options: Options) -> dict:
    logprobs = None
    if wire.logprobs or wire.top_logprobs:
        logprobs = wire.top_logprobs
    return {
        "model": model,
        "sampling": options.sampling,
        "max_tokens": options.max_tokens,
        "max_tokens_param": "options.num_predict",
        "stop": options.stop,
        "logprobs": logprobs,
        "constraint": _constraint(wire.format),
    }


# The order a schema's keys are written in where tools reach a prompt as JSON
SCHEMA_ORDER = ("type", "description", "properties", "required")


def _schema(schema: dict | None) -> dict | None:
    """A tool's parameters in the conventional order (type, description, properties,
    required, then the rest), its properties' schemas too. The `ollama` client writes
    `required` before `properties` (its models' field order); models see tools as the
    JSON their chat templates dump, and were trained on the order OpenAI's clients keep."""
    if not isinstance(schema, dict):
        return schema
    ordered = {key: schema[key] for key in SCHEMA_ORDER if key in schema}
    ordered |= {key: value for key, value in schema.items() if key not in ordered}
    properties = ordered.get("properties")
    if isinstance(properties, dict):
        ordered["properties"] = {name: _schema(value) for name, value in properties.items()}
    return ordered


def _thinking(think: bool | str | None) -> dict:
    """The chat template's thinking switch and effort; with no `think` the template's
    default holds."""
    if think is None:
        return {}
    effort = EFFORTS.get(think) if isinstance(think, str) else None
    return {"template_kwargs": {"enable_thinking": bool(think)}, "reasoning_effort": effort}


def _constraint(form: str | dict | None) -> neutral.Constraint | None:
    if form == "json":
        return neutral.Constraint("json_schema", {"type": "object"}, "format")
    if isinstance(form, dict):
        return neutral.Constraint("json_schema", form, "format")
    return None


def _messages(messages: list[Message]) -> tuple[neutral.Message, ...]:
    """Each message as the neutral one. Tool calls without ids get ids, and a tool message
    without `tool_call_id` answers the earliest unanswered call of its `tool_name` (else
    the earliest unanswered): templates that pair them find their pairs."""
    out: list[neutral.Message] = []
    unanswered: list[neutral.ToolCall] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if message.role == "assistant":
            calls = tuple(
                neutral.ToolCall(
                    call.id or f"call_{i}_{j}", call.function.name, call.function.arguments
                )
                for j, call in enumerate(message.tool_calls or [])
            )
            unanswered = list(calls)
            out.append(
                neutral.Message(
                    "assistant",
                    message.content,
                    param,
                    tool_calls=calls,
                    reasoning=message.thinking or None,
                )
            )
        elif message.role == "tool":
            call_id = message.tool_call_id or _answered(unanswered, message.tool_name)
            out.append(
                neutral.Message(
                    "tool", message.content, param, name=message.tool_name, tool_call_id=call_id
                )
            )
        else:
            content = _content(message.content, message.images, f"{param}.images")
            out.append(neutral.Message(message.role, content, param))
    return tuple(out)


def _answered(unanswered: list[neutral.ToolCall], name: str | None) -> str | None:
    for call in unanswered:
        if name is None or call.name == name:
            unanswered.remove(call)
            return call.id
    return unanswered.pop(0).id if unanswered else None


def _content(text: str, images: list[str] | None, param: str) -> str | tuple[neutral.Part, ...]:
    """Text alone, or the images (as data URIs) before the text, as Ollama places them."""
    if not images:
        return text
    parts: list[neutral.Part] = [
        neutral.ImagePart(_data_uri(image, f"{param}[{k}]"), f"{param}[{k}]")
        for k, image in enumerate(images)
    ]
    return (*parts, neutral.TextPart(text)) if text else tuple(parts)


def _data_uri(image: str, param: str) -> str:
    try:
        head = base64.b64decode(image[:64] + "=" * (-len(image[:64]) % 4), validate=False)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"The image is not base64: {e}.", param=param) from e
    media = next((kind for magic, kind in SIGNATURES if head.startswith(magic)), "image/png")
    return f"data:{media};base64,{image}"

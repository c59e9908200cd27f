"""Requests -> prompt tokens: chat messages through the model's chat template, or raw prompts."""

from __future__ import annotations

import json
import re

from jinja2 import TemplateError

from mlxserve.chat import tool_prompt
from mlxserve.postprocess.events import Content, Reasoning
from mlxserve.postprocess.harmony import HarmonyParser
from mlxserve.postprocess.reasoning import THINK
from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ChatRequest, CompletionRequest, MediaPart, Message, TextPart

# The gpt-oss convention clients such as Open WebUI and Dify use in the system prompt.
_EFFORT_LINE = re.compile(r"^\s*reasoning:\s*(low|medium|high)\s*$", re.IGNORECASE | re.MULTILINE)


def render_chat(
    tokenizer,
    request: ChatRequest,
    template_args: dict,
    chat_template: str | None,
    inject_tools: bool = False,
) -> list[int]:
    """Render the conversation with the model's template and tokenize it; with
    `inject_tools`, the tools go into the prompt as text (see tool_prompt)."""
    text = chat_text(tokenizer, request, template_args, chat_template, inject_tools)
    return tokenizer.encode(text, add_special_tokens=False)


def chat_text(
    tokenizer,
    request: ChatRequest,
    template_args: dict,
    chat_template: str | None,
    inject_tools: bool = False,
    modalities: frozenset[str] = frozenset(),
) -> str:
    """The conversation rendered by the chat template. A user turn holding media of the
    `modalities` the model takes ("image", "video", "audio") gets its content as parts
    ({"type": "image"}, {"type": "video"}, {"type": "audio"} where each goes, in the order
    of `media_parts`), as multimodal templates expect; any other media is a 400."""
    if not tokenizer.has_chat_template and chat_template is None:
        raise bad_request(
            "This model has no chat template; use /v1/completions or start the server "
            "with --chat-template.",
            param="messages",
        )
    messages = [_template_message(m, modalities) for m in request.messages]
    if not messages:  # every message was empty (content: [])
        raise bad_request(
            "The conversation is empty: send at least one message with content.",
            param=request.messages_param,
        )
    tools = request.tool_definitions
    if inject_tools:
        messages, tools = tool_prompt.inject_tools(messages, tools or []), None
    kwargs = {**template_args, **_request_template_kwargs(request, messages)}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template

    # A reply starts a new assistant turn, or continues the last one (a prefilled start).
    if request.continue_final:
        kwargs["continue_final_message"] = True
    else:
        kwargs["add_generation_prompt"] = True

    def apply(conversation: list[dict]) -> str:
        return tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False, **kwargs)

    # A template's own code can fail on a message shape it was not written for (a
    # text-only template adding a string to image parts: a TypeError): what the client
    # sent, so a 400 like a template's refusal.
    try:
        text = apply(messages)
    except (TemplateError, TypeError) as e:
        # Templates such as Gemma's refuse system turns or repeated roles: try once more.
        try:
            text = apply(tool_prompt.strict_alternation(messages))
        except (TemplateError, TypeError):
            raise bad_request(
                f"The chat template rejected the messages: {e}", param="messages"
            ) from e
    return text


def _request_template_kwargs(request: ChatRequest, messages: list[dict]) -> dict:
    """What a request tells the template: reasoning effort and thinking switches."""
    effort = request.reasoning_effort or _effort_from_system(messages)
    return {**({"reasoning_effort": effort} if effort else {}), **request.template_kwargs}


def _effort_from_system(messages: list[dict]) -> str | None:
    for message in messages:
        if message["role"] == "system" and (match := _EFFORT_LINE.search(message["content"])):
            return match.group(1).lower()
    return None


def _template_message(message: Message, modalities: frozenset[str]) -> dict:
    """The message as chat templates expect it: text content (or parts with images),
    object arguments."""
    role = message.role
    content = _content(message, modalities)
    reasoning = message.reasoning
    if role == "assistant" and not reasoning and isinstance(content, str):
        reasoning, content = _split_inline_reasoning(content)
    out: dict = {"role": role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if reasoning:
        # Templates read one or the other (Qwen: reasoning_content, gpt-oss: thinking).
        out["reasoning_content"] = out["thinking"] = reasoning
    return out


def _split_inline_reasoning(content: str) -> tuple[str | None, str]:
    """Clients showing reasoning inline send it back as <think>...</think> (or raw harmony
    channels) in content; templates expect it apart (most drop it from history)."""
    if "<|channel|>" in content:
        parser = HarmonyParser(tools_enabled=False)
        events = parser.feed(content) + parser.finish()
        reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
        return reasoning or None, "".join(e.text for e in events if isinstance(e, Content))
    start, end = THINK.start, THINK.end
    stripped = content.lstrip()
    if not stripped.startswith(start) or end not in stripped:
        return None, content
    reasoning, _, rest = stripped[len(start) :].partition(end)
    return reasoning.strip(), rest.lstrip()


def _content(message: Message, modalities: frozenset[str]) -> str | list[dict]:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts: list[dict] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        else:
            _check_media_allowed(message, part, modalities)
            parts.append({"type": part.kind})
    if any(p["type"] != "text" for p in parts):
        return parts
    return "\n".join(p["text"] for p in parts)


# Each modality's refusal where a model does not take it: (what to say, the error code)
_NOT_TAKEN = {
    "image": ("images; send them to a vision model", "images_not_supported"),
    "video": (
        "video; send it to a model that lists video in input_modalities",
        "video_not_supported",
    ),
    "audio": (
        "audio; send it to a model that lists audio in input_modalities",
        "audio_not_supported",
    ),
}


def _check_media_allowed(message: Message, part: MediaPart, modalities: frozenset[str]) -> None:
    if part.kind not in modalities:
        what, code = _NOT_TAKEN[part.kind]
        raise bad_request(f"This model does not accept {what}.", param=part.param, code=code)
    if message.role != "user":
        raise bad_request(
            f"{_PLURAL[part.kind]} are accepted in user messages only, not in a "
            f"{message.role} message.",
            param=part.param,
        )


_PLURAL = {"image": "Images", "video": "Videos", "audio": "Audio clips"}


def media_parts(request: ChatRequest) -> list[MediaPart]:
    """Every image, video and audio part, in the order the template places them."""
    return [
        part
        for message in request.messages
        if isinstance(message.content, tuple)
        for part in message.content
        if not isinstance(part, TextPart)
    ]


def _arguments(arguments: str | dict):
    """Templates format arguments themselves (often with `tojson`), so hand them an object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def encode_prompts(tokenizer, request: CompletionRequest) -> list[list[int]]:
    """Each prompt of a text completion request as token ids."""
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in request.prompts]
    param = request.prompt_param
    if any(not tokens for tokens in prompts):
        raise bad_request("The prompt must not be empty.", param=param)
    for tokens in prompts:
        check_token_ids(tokenizer, tokens, param)
    return prompts


def check_token_ids(tokenizer, tokens: list[int], param: str) -> None:
    vocab_size = len(tokenizer)
    if any(not 0 <= t < vocab_size for t in tokens):
        raise bad_request(f"Token ids must lie in [0, {vocab_size}).", param=param)

"""The neutral chat and completion requests every dialect is translated into.

Fields are already checked for type and range by the dialect (a 400 at the edge); what
needs the model (its template, tokenizer, capabilities) is checked below. Each piece that
may be at fault carries `param`: where the client put it, as its dialect names it."""

from __future__ import annotations

import json
import mimetypes
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    url: str  # a data URI, an http(s) URL, or a local path / file:// URL
    param: str
    kind: ClassVar[str] = "image"  # the modality, as templates' parts and errors name it


@dataclass(frozen=True)
class VideoPart:
    url: str  # as an image's
    param: str
    fps: float | None = None  # frames sampled a second (None: the server's --video-fps)
    kind: ClassVar[str] = "video"


@dataclass(frozen=True)
class AudioPart:
    url: str  # as an image's
    param: str
    kind: ClassVar[str] = "audio"

    @classmethod
    def inline(cls, data: str, audio_format: str, param: str) -> AudioPart:
        """OpenAI's input_audio ({"data": base64, "format": "wav"}) as a data URI."""
        name = audio_format.lower()
        kind = mimetypes.types_map.get(f".{name}", f"audio/{name}")
        return cls(f"data:{kind};base64,{data}", param)


MediaPart = ImagePart | VideoPart | AudioPart
Part = TextPart | MediaPart
# Each medium's part, by the first half of a MIME type (a file part names its type)
MEDIA_PARTS: dict[str, type[MediaPart]] = {
    "image": ImagePart,
    "video": VideoPart,
    "audio": AudioPart,
}


def media_part(mime_type: str | None, url: str, param: str) -> MediaPart | None:
    """The part a file of `mime_type` at `url` is, or None where it is no image, video
    or audio."""
    part = MEDIA_PARTS.get((mime_type or "").split("/")[0])
    return part(url, param) if part is not None else None


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made earlier in the conversation."""

    id: str | None
    name: str
    arguments: str | dict  # JSON text, or the object itself


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str | tuple[Part, ...] | None
    param: str  # e.g. "messages[2]"
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # a tool result: the call it answers
    reasoning: str | None = None  # an assistant turn's reasoning

    @property
    def text_length(self) -> int:
        parts = (TextPart(self.content),) if isinstance(self.content, str) else self.content
        texts = [p.text for p in parts or () if isinstance(p, TextPart)] + [self.reasoning or ""]
        texts += [
            c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
            for c in self.tool_calls
        ]
        return sum(map(len, texts))


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments
    strict: bool | None = None

    def definition(self, grammar: bool = False) -> dict:
        """The tool as chat templates and parsers take it (OpenAI's function shape, the
        one Hugging Face templates are written for). `strict` is the server's to enforce,
        so only the grammar sees it: in the prompt, `strict: false` (which some clients
        send with every tool) would make a prompt the model was not trained on."""
        function: dict[str, Any] = {"name": self.name, "description": self.description}
        function |= {"parameters": self.parameters, "strict": self.strict if grammar else None}
        return {
            "type": "function",
            "function": {k: v for k, v in function.items() if v is not None},
        }


ToolChoiceMode = Literal["auto", "none", "required"]
ConstraintKind = Literal["json_schema", "regex", "choice"]


@dataclass(frozen=True)
class ToolChoice:
    """auto: the model decides; none: no tools; required: at least one call; a `name`:
    a call of that tool."""

    mode: ToolChoiceMode = "auto"
    name: str | None = None
    param: str = "tool_choice"

    @property
    def forces_call(self) -> bool:
        return self.mode == "required" or self.name is not None


@dataclass(frozen=True)
class Constraint:
    """What the content must match: a JSON schema, a regular expression, or one of a
    list of strings."""

    kind: ConstraintKind
    value: dict | str | list[str]
    param: str
    strict: bool = False  # a strict JSON schema: its objects are closed unless it opens them


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters, declared once: the dialects fill them from the wire, the
    engine samples with them (`GenerationParams.sampling`). None: the server's default
    (`over` fills it in before the engine sees it)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None

    def over(self, defaults: object) -> Sampling:
        """These settings with their gaps filled: the server's default where `defaults` (a
        SamplingDefaults) has a field of the same name, XTC off otherwise."""
        gaps: dict[str, Any] = {"xtc_probability": 0.0, "xtc_threshold": 0.0}
        gaps |= {
            f.name: getattr(defaults, f.name) for f in fields(self) if hasattr(defaults, f.name)
        }
        return replace(
            self,
            **{name: value for name, value in gaps.items() if getattr(self, name) is None},
        )


@dataclass(frozen=True)
class GenerationRequest:
    """What chat and text completions share."""

    model: str | None = None
    # An adapter named apart from the model (mlx_lm.server's `adapters`): a served
    # adapter's name or folder; the model then names its base, or nothing
    adapter: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None  # None: the server's default, clipped to the context
    max_tokens_param: str = "max_tokens"
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: int | None = None  # None: none; 0: the chosen token's; k: also the k likeliest
    constraint: Constraint | None = None


@dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[Message, ...] = ()
    messages_param: str = "messages"
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    reasoning_effort: str | None = None  # low, medium or high
    template_kwargs: dict = field(default_factory=dict)  # extra chat template variables
    reasoning_budget: int | None = None  # most tokens of reasoning before the answer
    continue_final: bool = False  # the reply continues the last (assistant) message
    drop_oldest_to_fit: bool = False  # over the context: the oldest turns are left out
    guide_tool_calls: bool = True  # False: the request turned tool-call guiding off

    @property
    def text_length(self) -> int:
        """Characters of text the prompt is rendered from (messages, tools, template
        arguments): what bounds its tokens from below before anything is tokenized."""
        return sum(message.text_length for message in self.messages) + len(
            json.dumps([tool.definition() for tool in self.tools] + [self.template_kwargs])
        )

    @property
    def tool_definitions(self) -> list[dict] | None:
        """The tools as chat templates and parsers take them, unless tool_choice is none."""
        if not self.tools or self.tool_choice.mode == "none":
            return None
        return [tool.definition() for tool in self.tools]


@dataclass(frozen=True)
class FileChunk:
    """Another file of the project, given as context for a fill-in-the-middle."""

    filename: str
    text: str


@dataclass(frozen=True)
class Infill:
    """Fill in the middle: each prompt is the code before the cursor, `suffix` the code
    after it; `extra` other files of the project; `after_middle` text the middle starts
    with (llama.cpp's `prompt`). `param` names the field that asked for it."""

    suffix: str
    extra: tuple[FileChunk, ...] = ()
    after_middle: str = ""
    param: str = "suffix"


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompts: tuple[str | tuple[int, ...], ...] = ()  # text, or token ids
    prompt_param: str = "prompt"
    infill: Infill | None = None  # a fill-in-the-middle: the reply is the middle only


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str | None = None
    inputs: tuple[str | tuple[int, ...], ...] = ()  # texts, or token ids
    inputs_param: str = "input"
    dimensions: int | None = None  # keep this many leading dimensions, renormalised
    keep_last_tokens: int | None = None  # an input longer keeps its last ones; -1: the limit

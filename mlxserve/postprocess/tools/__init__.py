"""Tool-call formats: one entry per format, detected from the tokenizer or named by flag.

Every parser in `mlx_lm.tool_parsers` is registered as it is (markers and call-body parser);
formats whose arguments are a JSON object written after the name stream those arguments
as they are generated.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass

import mlx_lm.tool_parsers

from mlxserve.postprocess.tools import tool_code
from mlxserve.postprocess.tools.streaming import (
    HeaderJsonStream,
    JsonBodyStream,
    ReparseStream,
    WholeStream,
    bracket_closer,
    suffix_closer,
)

# Formats whose call body is {"name": ..., "arguments": {...}}: arguments stream as written.
JSON_BODY_FORMATS = {"json_tools"}
# Formats where a header names each call and a JSON object of arguments follows it.
HEADERS = {
    "mistral": re.compile(r"(?P<name>[\w-]+)\s*\[ARGS\]\s*"),
    "kimi_k2": re.compile(
        r"<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[^\s:<]+)(?::\d+)?\s*"
        r"<\|tool_call_argument_begin\|>\s*"
    ),
}
ALIASES = {"hermes": "json_tools", "qwen": "json_tools"}
# Formats streamed by re-parsing the growing body, made parseable by these closers.
PYTHON_CALLS = bracket_closer(('"', "'"), "(")
CLOSERS = {
    "qwen3_coder": suffix_closer("</function>"),
    "glm47": suffix_closer(""),
    "laguna": suffix_closer(""),
    "longcat": suffix_closer(""),
    "minimax_m2": suffix_closer("</invoke>"),
    "minicpm5": suffix_closer(""),
    "muse_spark": suffix_closer("</atem:invoke>"),
    "kimi_k3": suffix_closer("<|close|>call<|sep|>"),
    "pythonic": PYTHON_CALLS,
    "gemma4": bracket_closer(('<|"|>',), "{"),
    "function_gemma": bracket_closer(("<escape>",), "{"),
    "tool_code": PYTHON_CALLS,
}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str
    end: str  # "" when a call runs to the end of the reply
    parse: Callable  # (body text, tools) -> {"name", "arguments"} or a list of them
    json_body: bool = False
    header: re.Pattern | None = None
    closer: Callable | None = None

    def argument_stream(self, tools: list[dict] | None):
        """A stream that turns one call block into call starts and argument fragments."""
        if self.json_body:
            return JsonBodyStream(self.parse, tools)
        if self.header is not None:
            return HeaderJsonStream(self.parse, tools, self.header)
        if self.closer is not None:
            return ReparseStream(self.parse, tools, self.closer)
        return WholeStream(self.parse, tools)


def _mlx_lm_formats() -> dict[str, ToolFormat]:
    formats = {}
    for info in pkgutil.iter_modules(mlx_lm.tool_parsers.__path__):
        module = importlib.import_module(f"mlx_lm.tool_parsers.{info.name}")
        if hasattr(module, "parse_tool_call") and hasattr(module, "tool_call_start"):
            formats[info.name] = ToolFormat(
                info.name,
                module.tool_call_start,
                module.tool_call_end,
                module.parse_tool_call,
                json_body=info.name in JSON_BODY_FORMATS,
                header=HEADERS.get(info.name),
                closer=CLOSERS.get(info.name),
            )
    return formats


FORMATS = _mlx_lm_formats()
# Our own: calls in ```tool_code blocks, for tools injected into the prompt.
FORMATS["tool_code"] = ToolFormat(
    "tool_code",
    tool_code.tool_call_start,
    tool_code.tool_call_end,
    tool_code.parse_tool_call,
    closer=CLOSERS["tool_code"],
)


def names() -> list[str]:
    return sorted([*FORMATS, *ALIASES])


def by_name(name: str) -> ToolFormat:
    return FORMATS[ALIASES.get(name, name)]


def detect(tokenizer) -> ToolFormat | None:
    """The format mlx-lm inferred for this tokenizer (from its template or vocabulary)."""
    parser = getattr(tokenizer, "tool_parser", None)
    if parser is None:
        return None
    return FORMATS.get(parser.__module__.rsplit(".", 1)[-1])

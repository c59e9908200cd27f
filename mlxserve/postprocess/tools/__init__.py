"""Tool-call formats: one entry per format, detected from the tokenizer or named by flag.

Every parser in `mlx_lm.tool_parsers` is registered as it is (markers and call-body parser);
formats whose arguments are a JSON object written after the name stream those arguments
as they are generated.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import mlx_lm.tool_parsers

from mlxserve.postprocess.tools import tool_code
from mlxserve.postprocess.tools.json_stream import JsonArgumentsStream
from mlxserve.postprocess.tools.reparse_stream import ReparseArgumentsStream

# Formats whose call body is {"name": ..., "arguments": {...}}: arguments stream as written.
JSON_BODY_FORMATS = {"json_tools"}
# XML-style formats whose partial body parses once closed with this suffix: arguments
# stream parameter by parameter (see reparse_stream).
REPARSE_SUFFIXES = {
    "qwen3_coder": "</function>",
    "glm47": "",
    "laguna": "",
    "longcat": "",
    "minimax_m2": "</invoke>",
    "minicpm5": "",
    "muse_spark": "</atem:invoke>",
    "kimi_k3": "<|close|>call<|sep|>",
}
ALIASES = {"hermes": "json_tools", "qwen": "json_tools"}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str
    end: str  # "" when a call runs to the end of the reply
    parse: Callable  # (body text, tools) -> {"name", "arguments"} or a list of them
    json_body: bool = False
    reparse_suffix: str | None = None

    def argument_stream(self, tools: list[dict] | None):
        """How this format streams a call's arguments, or None: all at once on close."""
        if self.json_body:
            return JsonArgumentsStream(self.parse, tools)
        if self.reparse_suffix is not None:
            return ReparseArgumentsStream(self.parse, tools, self.reparse_suffix)
        return None


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
                reparse_suffix=REPARSE_SUFFIXES.get(info.name),
            )
    return formats


FORMATS = _mlx_lm_formats()
# Our own: calls in ```tool_code blocks, for tools injected into the prompt.
FORMATS["tool_code"] = ToolFormat(
    "tool_code", tool_code.tool_call_start, tool_code.tool_call_end, tool_code.parse_tool_call
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

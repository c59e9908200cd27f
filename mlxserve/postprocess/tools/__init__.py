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

# Formats whose call body is {"name": ..., "arguments": {...}}: arguments can be streamed.
JSON_BODY_FORMATS = {"json_tools"}
ALIASES = {"hermes": "json_tools", "qwen": "json_tools"}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str
    end: str  # "" when a call runs to the end of the reply
    parse: Callable  # (body text, tools) -> {"name", "arguments"} or a list of them
    json_body: bool = False


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

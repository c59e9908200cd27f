"""Tool-call formats: one entry per format, detected from the tokenizer or named by flag.

Every parser in `mlx_lm.tool_parsers` is registered as it is (markers and call-body parser),
with what `TRAITS` adds for it: how its arguments stream, how a call is forced into it.
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
from mlxserve.structured import tool_calls

# Python-style calls, streamed by re-parsing the growing body closed with these.
PYTHON_CALLS = bracket_closer(('"', "'"), "(")


@dataclass(frozen=True)
class Traits:
    """What mlxserve adds to a format's parser: how its arguments stream (as a JSON
    {"name", "arguments"} body written out, a JSON object after a header naming the call,
    or by re-parsing the growing body made parseable by a closer; else whole calls), and
    how a call is forced into it (None: it cannot be)."""

    json_body: bool = False
    header: re.Pattern | None = None
    closer: Callable | None = None
    forced_call: tool_calls.CallWriter | None = None


# Every format mlxserve knows more about than its parser. A format new to mlx-lm works
# with no entry (whole calls, not forceable); adding one here is all its streaming and
# forcing need.
TRAITS: dict[str, Traits] = {
    "json_tools": Traits(json_body=True, forced_call=tool_calls.hermes),
    "mistral": Traits(
        header=re.compile(r"(?P<name>[\w-]+)\s*\[ARGS\]\s*"), forced_call=tool_calls.mistral
    ),
    "kimi_k2": Traits(
        header=re.compile(
            r"<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[^\s:<]+)(?::\d+)?\s*"
            r"<\|tool_call_argument_begin\|>\s*"
        ),
        forced_call=tool_calls.kimi,
    ),
    "qwen3_coder": Traits(closer=suffix_closer("</function>"), forced_call=tool_calls.qwen3_coder),
    "glm47": Traits(closer=suffix_closer("")),
    "laguna": Traits(closer=suffix_closer("")),
    "longcat": Traits(closer=suffix_closer("")),
    "minimax_m2": Traits(closer=suffix_closer("</invoke>")),
    "minicpm5": Traits(closer=suffix_closer("")),
    "muse_spark": Traits(closer=suffix_closer("</atem:invoke>")),
    "kimi_k3": Traits(closer=suffix_closer("<|close|>call<|sep|>")),
    "pythonic": Traits(closer=PYTHON_CALLS),
    "gemma4": Traits(closer=bracket_closer(('<|"|>',), "{")),
    "function_gemma": Traits(closer=bracket_closer(("<escape>",), "{")),
    "tool_code": Traits(closer=PYTHON_CALLS, forced_call=tool_calls.tool_code),
}
ALIASES = {"hermes": "json_tools", "qwen": "json_tools"}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str
    end: str  # "" when a call runs to the end of the reply
    parse: Callable  # (body text, tools) -> {"name", "arguments"} or a list of them
    traits: Traits = Traits()

    def argument_stream(self, tools: list[dict] | None):
        """A stream that turns one call block into call starts and argument fragments."""
        traits = self.traits
        if traits.json_body:
            return JsonBodyStream(self.parse, tools)
        if traits.header is not None:
            return HeaderJsonStream(self.parse, tools, traits.header)
        if traits.closer is not None:
            return ReparseStream(self.parse, tools, traits.closer)
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
                TRAITS.get(info.name, Traits()),
            )
    return formats


FORMATS = _mlx_lm_formats()
# Our own: calls in ```tool_code blocks, for tools injected into the prompt.
FORMATS["tool_code"] = ToolFormat(
    "tool_code",
    tool_code.tool_call_start,
    tool_code.tool_call_end,
    tool_code.parse_tool_call,
    TRAITS["tool_code"],
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

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
import mlx_lm.tool_parsers.gemma4
import mlx_lm.tool_parsers.longcat

from mlxserve.postprocess.tools import tool_code
from mlxserve.postprocess.tools.streaming import (
    HeaderJsonStream,
    JsonBodyStream,
    ReparseStream,
    WholeStream,
    bracket_closer,
    suffix_closer,
)
from mlxserve.structured import gemma_calls, tagged_calls, tool_calls

# Python-style calls, streamed by re-parsing the growing body closed with these.
PYTHON_CALLS = bracket_closer(('"', "'"), "(")


@dataclass(frozen=True)
class Traits:
    """What mlxserve adds to a format's parser: how its arguments stream (as a JSON
    {"name", "arguments"} body written out, a JSON object after a header naming the call,
    or by re-parsing the growing body made parseable by a closer; else whole calls), and
    how a call is written as a grammar (to force or guide it), and a parser of our own
    where mlx-lm's reads less than the format holds."""

    json_body: bool = False
    header: re.Pattern | None = None
    closer: Callable | None = None
    forced_call: tool_calls.CallWriter | None = None
    parse: Callable | None = None
    guided: bool = True  # calls under tool_choice "auto" follow the writer's grammar


def function_gemma_parse(text: str, tools: list[dict] | None = None):
    """FunctionGemma's calls read as Gemma 4's, whose markup it shares but for the string
    delimiter: mlx-lm's own function_gemma parser reads flat arguments only, and splits a
    nested object or array at its first comma."""
    return mlx_lm.tool_parsers.gemma4.parse_tool_call(
        text.replace(gemma_calls.FUNCTION_GEMMA_STRING, gemma_calls.GEMMA4_STRING), tools
    )


def longcat_parse(text: str, tools: list[dict] | None = None):
    """LongCat's calls, and a call with no arguments (its name alone), which mlx-lm's
    parser cannot read (it looks for the name before the first argument)."""
    if "<longcat_arg_key>" not in text and not text.strip().startswith("{"):
        return {"name": text.strip(), "arguments": {}}
    return mlx_lm.tool_parsers.longcat.parse_tool_call(text, tools)


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
    "glm47": Traits(closer=suffix_closer(""), forced_call=tagged_calls.glm47),
    "laguna": Traits(closer=suffix_closer(""), forced_call=tagged_calls.glm47),
    "longcat": Traits(
        closer=suffix_closer(""), forced_call=tagged_calls.longcat, parse=longcat_parse
    ),
    "minimax_m2": Traits(closer=suffix_closer("</invoke>"), forced_call=tagged_calls.minimax_m2),
    "minicpm5": Traits(closer=suffix_closer(""), forced_call=tagged_calls.minicpm5),
    "muse_spark": Traits(
        closer=suffix_closer("</atem:invoke>"), forced_call=tagged_calls.muse_spark
    ),
    "kimi_k3": Traits(
        closer=suffix_closer("<|close|>call<|sep|>"), forced_call=tagged_calls.kimi_k3
    ),
    "pythonic": Traits(closer=PYTHON_CALLS, forced_call=tool_calls.pythonic),
    "gemma4": Traits(closer=bracket_closer(('<|"|>',), "{"), forced_call=gemma_calls.gemma4),
    "function_gemma": Traits(
        closer=bracket_closer(("<escape>",), "{"),
        forced_call=gemma_calls.function_gemma,
        parse=function_gemma_parse,
    ),
    # Injected tools: the model was taught no format, and writes Python calls, positional
    # ones or shell-style ones (all read back); guiding `auto` calls into the writer's one
    # form would change what it writes. A forced call is written in that form.
    "tool_code": Traits(closer=PYTHON_CALLS, forced_call=tool_calls.tool_code, guided=False),
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
            traits = TRAITS.get(info.name, Traits())
            formats[info.name] = ToolFormat(
                info.name,
                module.tool_call_start,
                module.tool_call_end,
                traits.parse or module.parse_tool_call,
                traits,
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

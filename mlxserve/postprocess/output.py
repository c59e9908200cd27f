"""The per-choice output pipeline: parse the model text, then present reasoning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlxserve.postprocess import reasoning, tools
from mlxserve.postprocess.events import Content, Event
from mlxserve.postprocess.harmony import (
    ANALYSIS_CLOSING,
    ANALYSIS_OPENING,
    FINAL_OPENING,
    HarmonyParser,
    is_harmony,
)
from mlxserve.postprocess.parser import OutputParser, ThinkTags
from mlxserve.postprocess.reasoning import ReasoningPresenter
from mlxserve.postprocess.tools import ToolFormat

HARMONY = "harmony"


class TextOutput:
    """Text completions: the model text as it is."""

    in_reasoning = False

    def feed(self, text: str) -> list[Event]:
        return [Content(text)] if text else []

    def finish(self) -> list[Event]:
        return []


class ChatOutput:
    def __init__(self, parser: OutputParser | HarmonyParser, presenter: ReasoningPresenter):
        self._parser = parser
        self._presenter = presenter

    @property
    def in_reasoning(self) -> bool:
        return self._parser.in_reasoning

    @property
    def unparsed_calls(self) -> int:
        """Call blocks the reply opened that could not be read (returned as content)."""
        return self._parser.unparsed_calls

    def feed(self, text: str) -> list[Event]:
        return self._presenter(self._parser.feed(text))

    def finish(self) -> list[Event]:
        return self._presenter(self._parser.finish()) + self._presenter.finish()


@dataclass(frozen=True)
class ChatMarkup:
    """How a model's replies mark reasoning and tool calls: what the output parser reads
    and what grammars for constrained decoding must let the model write."""

    harmony: bool
    think: ThinkTags | None
    tool_format: ToolFormat | None  # None: no tools in the request, or harmony


def chat_markup(
    tokenizer,
    *,
    reasoning_parser: str | None,
    tool_parser: str | None,
    tools_in_request: list[dict] | None,
    injected_tools: bool = False,
) -> ChatMarkup:
    """The formats named by flag, else the ones detected from the tokenizer (```tool_code
    for tools injected into the prompt). Tool calls are parsed only when the request has
    tools."""
    harmony = HARMONY in (reasoning_parser, tool_parser) or (
        reasoning_parser is None and tool_parser is None and is_harmony(tokenizer)
    )
    if reasoning_parser is not None and reasoning_parser != HARMONY:
        think = reasoning.TAGS_BY_NAME[reasoning_parser]
    else:
        think = reasoning.detect(tokenizer)
    tool_format = None
    if tools_in_request and not harmony:
        if tool_parser:
            tool_format = tools.by_name(tool_parser)
        elif injected_tools:
            tool_format = tools.by_name("tool_code")
        else:
            tool_format = tools.detect(tokenizer)
    return ChatMarkup(harmony, think, tool_format)


def reasoning_markers(markup: ChatMarkup) -> tuple[str, str] | None:
    """The text that opens reasoning and the text that closes it for the answer to
    follow; None for a model that does not reason in markup."""
    if markup.harmony:
        return ANALYSIS_OPENING, ANALYSIS_CLOSING + FINAL_OPENING
    if markup.think is not None:
        return markup.think.start, markup.think.end
    return None


def chat_output_factory(
    tokenizer,
    markup: ChatMarkup,
    *,
    reasoning_format: str,
    tools_in_request: list[dict] | None,
    parallel_tool_calls: bool,
) -> Callable[[list[int]], ChatOutput]:
    """Per-choice output pipelines for one request."""

    def make(prompt: list[int]) -> ChatOutput:
        parser: HarmonyParser | OutputParser
        if markup.harmony:
            parser = HarmonyParser(bool(tools_in_request), parallel_tool_calls)
        else:
            parser = OutputParser(
                markup.think,
                markup.tool_format,
                tools_in_request,
                starts_in_reasoning=reasoning.starts_in_reasoning(tokenizer, prompt, markup.think),
                parallel_tool_calls=parallel_tool_calls,
            )
        return ChatOutput(parser, ReasoningPresenter(reasoning_format))

    return make

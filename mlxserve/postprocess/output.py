"""The per-choice output pipeline: parse the model text, then present reasoning."""

from __future__ import annotations

from mlxserve.postprocess.events import Content, Event
from mlxserve.postprocess.parser import OutputParser
from mlxserve.postprocess.reasoning import ReasoningPresenter


class TextOutput:
    """Text completions: the model text as it is."""

    in_reasoning = False

    def feed(self, text: str) -> list[Event]:
        return [Content(text)] if text else []

    def finish(self) -> list[Event]:
        return []


class ChatOutput:
    def __init__(self, parser: OutputParser, presenter: ReasoningPresenter):
        self._parser = parser
        self._presenter = presenter

    @property
    def in_reasoning(self) -> bool:
        return self._parser.in_reasoning

    def feed(self, text: str) -> list[Event]:
        return self._presenter(self._parser.feed(text))

    def finish(self) -> list[Event]:
        return self._presenter(self._parser.finish()) + self._presenter.finish()

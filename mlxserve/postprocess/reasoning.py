"""Reasoning: which tags a model thinks in, whether its prompt opens them, how to show it."""

from __future__ import annotations

from mlxserve.postprocess.events import Content, Event, Reasoning
from mlxserve.postprocess.parser import ThinkTags

THINK = ThinkTags("<think>", "</think>")
TAGS_BY_NAME: dict[str, ThinkTags | None] = {"think": THINK, "none": None}
FORMATS = ("separate", "think-tags", "details", "hidden")
WRAPPERS = {  # how inline formats open and close a reasoning block
    "think-tags": ("<think>", "</think>\n\n"),
    "details": ("<details>\n<summary>Thinking</summary>\n\n", "\n</details>\n\n"),
}


def detect(tokenizer) -> ThinkTags | None:
    """The think tags mlx-lm found in the tokenizer's vocabulary, if any."""
    if getattr(tokenizer, "has_thinking", False):
        return ThinkTags(tokenizer.think_start, tokenizer.think_end)
    return None


def starts_in_reasoning(tokenizer, prompt: list[int], tags: ThinkTags | None) -> bool:
    """Whether the rendered prompt already opened a think block (Qwen3 thinking, DeepSeek-R1),
    so that generation begins inside the reasoning."""
    return tags is not None and _prompt_tail(tokenizer, prompt).endswith(tags.start)


def reasoning_skipped(tokenizer, prompt: list[int], tags: ThinkTags | None) -> bool:
    """Whether the rendered prompt ends with a closed think block (Qwen3 with thinking
    turned off writes an empty one), so that the reply is the answer itself."""
    return tags is not None and _prompt_tail(tokenizer, prompt).endswith(tags.end)


def _prompt_tail(tokenizer, prompt: list[int]) -> str:
    return tokenizer.decode(prompt[-16:]).rstrip()


class ReasoningPresenter:
    """Turns reasoning events into what the client asked for with --reasoning-format:
    separate fields (default), inline <think> tags, a <details> block, or nothing."""

    def __init__(self, mode: str):
        self._mode = mode
        self._open = False

    def __call__(self, events: list[Event]) -> list[Event]:
        if self._mode == "separate":
            return events
        out: list[Event] = []
        for event in events:
            if not isinstance(event, Reasoning):
                out += self._close()
                out.append(event)
            elif self._mode in WRAPPERS:
                if not self._open:
                    self._open = True
                    out.append(Content(WRAPPERS[self._mode][0]))
                out.append(Content(event.text))
        return out

    def finish(self) -> list[Event]:
        return self._close()

    def _close(self) -> list[Event]:
        if not self._open:
            return []
        self._open = False
        return [Content(WRAPPERS[self._mode][1])]

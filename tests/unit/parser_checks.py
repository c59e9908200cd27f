"""Shared checks for the output parsers: feed text in pieces, summarise what came out."""

from __future__ import annotations

from collections.abc import Callable

from mlxserve.postprocess.events import Content, Reasoning, ToolCallStart


def summary(events) -> dict:
    """What a client ends up with: content, reasoning, and (name, arguments) per call."""
    out = {"content": "", "reasoning": "", "calls": []}
    for event in events:
        if isinstance(event, Content):
            out["content"] += event.text
        elif isinstance(event, Reasoning):
            out["reasoning"] += event.text
        elif isinstance(event, ToolCallStart):
            assert event.index == len(out["calls"]) and event.id.startswith("call_")
            out["calls"].append([event.name, ""])
        else:
            out["calls"][event.index][1] += event.text
    out["calls"] = [tuple(c) for c in out["calls"]]
    return out


def run(make_parser: Callable, pieces, **options) -> dict:
    parser = make_parser(**options)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return summary(events + parser.finish())


def every_split(make_parser: Callable, text: str, expected: dict, **options) -> None:
    """Whole, one character at a time, and in two pieces at every boundary: all the same."""
    assert run(make_parser, [text], **options) == expected
    assert run(make_parser, list(text), **options) == expected
    for i in range(len(text) + 1):
        assert run(make_parser, [text[:i], text[i:]], **options) == expected, i

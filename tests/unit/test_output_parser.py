"""OutputParser on recorded model text: every format, fed whole, in two pieces at every
boundary, and one character at a time, must give the same result."""

from __future__ import annotations

import parser_checks
import pytest
from conversations import WEATHER_TOOL
from helpers.parsers import PARIS
from tool_samples import FORECAST_TOOL, SAMPLES, STREAMING_SAMPLES, TWO_CALLS

from mlxserve.postprocess import tools
from mlxserve.postprocess.events import ToolCallArguments, ToolCallStart
from mlxserve.postprocess.parser import OutputParser
from mlxserve.postprocess.reasoning import THINK, ReasoningPresenter


def run(pieces, **options) -> dict:
    return parser_checks.run(OutputParser, pieces, **options)


def every_split(text: str, expected: dict, **options) -> None:
    parser_checks.every_split(OutputParser, text, expected, **options)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_format_at_every_boundary(name):
    text = "Let me check.\n" + SAMPLES[name]
    options = {"tool_format": tools.by_name(name), "tools": [WEATHER_TOOL]}
    every_split(text, {"content": "Let me check.", "reasoning": "", "calls": [PARIS]}, **options)


def test_every_format_has_a_sample():
    assert set(SAMPLES) == set(tools.FORMATS)
    assert set(STREAMING_SAMPLES) == set(tools.FORMATS)


@pytest.mark.parametrize("name", sorted(TWO_CALLS))
def test_two_calls_in_one_block(name):
    options = {"tool_format": tools.by_name(name), "tools": [FORECAST_TOOL]}
    calls = [
        ("forecast", '{"city": "Paris", "days": 3}'),
        ("forecast", '{"city": "Rome", "days": 5}'),
    ]
    every_split(TWO_CALLS[name], {"content": "", "reasoning": "", "calls": calls}, **options)
    one = run([TWO_CALLS[name]], parallel_tool_calls=False, **options)
    assert one["calls"] == calls[:1]


def test_parallel_hermes_calls_leak_no_whitespace():
    call = SAMPLES["json_tools"]
    london = call.replace("Paris", "London")
    text = f"\n{call}\n\n{london}\n"
    expected = {
        "content": "",
        "reasoning": "",
        "calls": [PARIS, ("get_weather", '{"city": "London"}')],
    }
    every_split(text, expected, tool_format=tools.by_name("hermes"))


def test_think_then_content_then_call():
    text = "<think>\nWeather needs a tool.\n</think>\n\nChecking." + SAMPLES["json_tools"]
    expected = {"content": "Checking.", "reasoning": "Weather needs a tool.", "calls": [PARIS]}
    every_split(text, expected, think=THINK, tool_format=tools.by_name("hermes"))


def test_generation_that_starts_inside_reasoning():
    text = "Thinking hard.\n</think>\n\nDone."
    expected = {"content": "Done.", "reasoning": "Thinking hard.", "calls": []}
    every_split(text, expected, think=THINK, starts_in_reasoning=True)


def test_unterminated_reasoning_stays_reasoning():
    expected = {"content": "", "reasoning": "I was cut off mid", "calls": []}
    every_split("<think>I was cut off mid", expected, think=THINK)


def test_think_tags_without_a_think_parser_are_content():
    text = "<think>x</think>y"
    assert run([text]) == {"content": text, "reasoning": "", "calls": []}


@pytest.mark.parametrize("name", sorted(STREAMING_SAMPLES))
def test_arguments_stream_before_the_call_closes(name):
    head, tail = STREAMING_SAMPLES[name]
    options = {"tool_format": tools.by_name(name), "tools": [FORECAST_TOOL]}
    parser = OutputParser(**options)
    events = parser.feed(head)
    assert isinstance(events[0], ToolCallStart) and events[0].name == "forecast"
    assert "".join(e.text for e in events[1:]) == '{"city": "Paris"'
    rest = parser.feed(tail) + parser.finish()
    assert "".join(e.text for e in rest if isinstance(e, ToolCallArguments)) == ', "days": 3}'
    expected = {
        "content": "",
        "reasoning": "",
        "calls": [("forecast", '{"city": "Paris", "days": 3}')],
    }
    every_split(head + tail, expected, **options)


def test_unparsable_call_is_returned_as_content():
    text = "<tool_call>\nnot json at all\n</tool_call>"
    assert run([text], tool_format=tools.by_name("hermes")) == {
        "content": text,
        "reasoning": "",
        "calls": [],
    }


def test_call_cut_off_by_length_keeps_what_streamed():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    result = run([text], tool_format=tools.by_name("hermes"))
    assert result["calls"] == [("get_weather", '{"city": "Par')]


@pytest.mark.parametrize("name", ["json_tools", "qwen3_coder", "pythonic"])
def test_parallel_tool_calls_false_keeps_the_first_call(name):
    call = SAMPLES[name]
    text = call + call.replace("Paris", "London")
    result = run([text], tool_format=tools.by_name(name), parallel_tool_calls=False)
    assert result["calls"] == [PARIS]
    assert len(run([text], tool_format=tools.by_name(name))["calls"]) == 2


@pytest.mark.parametrize(
    ("mode", "content"),
    [
        ("separate", "Answer."),
        ("think-tags", "<think>Why.</think>\n\nAnswer."),
        ("details", "<details>\n<summary>Thinking</summary>\n\nWhy.\n</details>\n\nAnswer."),
        ("hidden", "Answer."),
    ],
)
def test_reasoning_formats(mode, content):
    presenter = ReasoningPresenter(mode)
    parser = OutputParser(think=THINK)
    events = []
    for piece in "<think>Why.</think>Answer.":
        events += presenter(parser.feed(piece))
    events += presenter(parser.finish()) + presenter.finish()
    result = parser_checks.summary(events)
    assert result["content"] == content
    assert result["reasoning"] == ("Why." if mode == "separate" else "")


def test_unterminated_reasoning_is_closed_in_inline_formats():
    presenter = ReasoningPresenter("think-tags")
    parser = OutputParser(think=THINK)
    events = presenter(parser.feed("<think>cut")) + presenter(parser.finish()) + presenter.finish()
    assert parser_checks.summary(events)["content"] == "<think>cut</think>\n\n"

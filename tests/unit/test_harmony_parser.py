"""The harmony parser on recorded gpt-oss text, split at every chunk boundary."""

from __future__ import annotations

import parser_checks
import pytest
from helpers.parsers import PARIS

from mlxserve.postprocess.harmony import HarmonyParser

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)


def run(pieces, **options) -> dict:
    return parser_checks.run(HarmonyParser, pieces, **options)


def every_split(text: str, expected: dict, **options) -> None:
    parser_checks.every_split(HarmonyParser, text, expected, **options)


REASONING = "The user wants the weather."


@pytest.mark.parametrize("end", ["", "<|return|>"])
def test_analysis_then_final(end):
    expected = {"content": "It is sunny in Paris.", "reasoning": REASONING, "calls": []}
    every_split(ANALYSIS + FINAL + end, expected)


@pytest.mark.parametrize("end", ["", "<|call|>"])
def test_analysis_then_tool_call(end):
    every_split(ANALYSIS + CALL + end, {"content": "", "reasoning": REASONING, "calls": [PARIS]})


def test_recipient_before_the_channel():
    text = (
        ANALYSIS
        + '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    )
    every_split(text, {"content": "", "reasoning": REASONING, "calls": [PARIS]})


def test_preamble_then_two_calls():
    text = (
        "<|channel|>commentary<|message|>Checking both.<|end|>"
        + CALL
        + "<|call|>"
        + CALL.replace("Paris", "London")
    )
    expected = {
        "content": "Checking both.",
        "reasoning": "",
        "calls": [PARIS, ("get_weather", '{"city": "London"}')],
    }
    every_split(text, expected)
    one = run([text], parallel_tool_calls=False)
    assert one["calls"] == [PARIS]


def test_calls_are_not_parsed_without_tools():
    assert run([ANALYSIS + CALL], tools_enabled=False) == {
        "content": "",
        "reasoning": REASONING,
        "calls": [],
    }


def test_cut_off_in_analysis():
    every_split(
        "<|channel|>analysis<|message|>Still think",
        {"content": "", "reasoning": "Still think", "calls": []},
    )

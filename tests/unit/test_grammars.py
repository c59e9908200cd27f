"""The grammars around a constrained body, checked against llguidance with the fixture
tokenizer: what a reply may contain before the body, for think markers that are special
tokens and for markers in plain text (as `<think>` is in Qwen3's real tokenizer)."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxserve.structured import lark
from mlxserve.structured.matcher import (
    Grammar,
    GrammarError,
    failure_message,
    is_special,
    markup_lark,
)

INTEGER = lark.json_schema({"type": "integer", "minimum": 0, "maximum": 99})


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def accepts(tokenizer, grammar: Grammar, text: str) -> bool:
    """Whether `text`, as the model would tokenize it, is a whole reply of the grammar."""
    matcher = grammar.processor()._matcher
    return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and (
        matcher.is_accepting()
    )


def thinking(tokenizer, start: str, end: str, opened: bool) -> lark.Thinking:
    special = is_special(tokenizer, start) and is_special(tokenizer, end)
    return lark.Thinking(
        markup_lark(tokenizer, start), markup_lark(tokenizer, end), special, opened
    )


@pytest.mark.parametrize(("start", "end"), [("<think>", "</think>"), ("<reason>", "</reason>")])
def test_an_optional_thought_then_the_body(tokenizer, start, end):
    grammar = Grammar(
        tokenizer, lark.after_thinking(INTEGER, thinking(tokenizer, start, end, False))
    )
    assert accepts(tokenizer, grammar, "42")
    assert accepts(tokenizer, grammar, f"{start}\nSix times seven.\n{end}\n\n42")
    assert not accepts(tokenizer, grammar, f"{start}\nSix times seven.\n{end}\n\nforty-two")
    assert not accepts(tokenizer, grammar, "\n\n42")  # no blank line without a thought
    assert not accepts(tokenizer, grammar, f"{start} unfinished")


@pytest.mark.parametrize(("start", "end"), [("<think>", "</think>"), ("<reason>", "</reason>")])
def test_a_thought_the_prompt_opened_must_close_first(tokenizer, start, end):
    grammar = Grammar(
        tokenizer, lark.after_thinking(INTEGER, thinking(tokenizer, start, end, True))
    )
    assert accepts(tokenizer, grammar, f"Six times seven.{end}\n\n42")
    assert not accepts(tokenizer, grammar, "42")


def test_text_markers_end_the_thought_at_the_first_end_marker(tokenizer):
    """A lazy thought: what follows the first </reason> is the body, not more thought."""
    grammar = Grammar(
        tokenizer,
        lark.after_thinking(INTEGER, thinking(tokenizer, "<reason>", "</reason>", False)),
    )
    assert not accepts(tokenizer, grammar, "<reason>a</reason>b</reason>42")


def test_special_tokens_are_written_by_id_and_text_is_quoted(tokenizer):
    think = tokenizer.encode("<think>", add_special_tokens=False)[0]
    assert markup_lark(tokenizer, "<think>plan") == f'<[{think}]> "plan"'
    assert markup_lark(tokenizer, 'say "hi"') == '"say \\"hi\\""'


def test_choices_and_regexes_match_exactly(tokenizer):
    choice = Grammar(tokenizer, lark.grammar(lark.choice(["yes", 'a "quoted"\nline'])))
    assert accepts(tokenizer, choice, 'a "quoted"\nline') and not accepts(tokenizer, choice, "ye")
    regex = Grammar(tokenizer, lark.grammar(lark.regex(r"[0-9]{2}/[a-z]+\/x")))
    assert accepts(tokenizer, regex, "12/ab/x") and not accepts(tokenizer, regex, "12/AB/x")


def test_json_is_laid_out_as_json_dumps_does(tokenizer):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
    }
    grammar = Grammar(tokenizer, lark.grammar(lark.json_schema(schema)))
    assert accepts(tokenizer, grammar, '{"a": [1, 2]}')
    assert not accepts(tokenizer, grammar, '{ "a" : [1,2] }')
    loose = {**schema, "x-guidance": {"whitespace_flexible": True}}
    assert accepts(
        tokenizer, Grammar(tokenizer, lark.grammar(lark.json_schema(loose))), '{ "a" : [1,2] }'
    )


def test_the_engine_names_what_it_cannot_do(tokenizer):
    with pytest.raises(GrammarError) as error:
        Grammar(tokenizer, lark.grammar(lark.json_schema({"not": {"type": "string"}})))
    assert str(error.value) == 'failed to compile JSON schema: Unimplemented keys: ["not"]'
    with pytest.raises(GrammarError) as error:
        Grammar(tokenizer, lark.grammar(lark.regex("(?=a)b")))
    assert "look-around" in str(error.value) and "body:" not in str(error.value)


def test_a_panic_of_the_engine_reads_as_one_line_without_its_stack():
    text = "panic: assertion failed: grammar.symbols.len() < u16::MAX <backtrace> 0: <unknown>"
    assert (
        failure_message([text], None) == "panic: assertion failed: grammar.symbols.len() < u16::MAX"
    )


@pytest.mark.parametrize(
    ("required", "written", "refused"),
    [
        ((True, False, True), ["a, c", "a, b, c"], ["a, b", "b, c", "a, c, b", "a,c"]),
        ((False, False, False), ["", "a", "b", "c", "a, c", "a, b, c"], ["b, a", ", a"]),
        ((False, True, False), ["b", "a, b", "b, c"], ["", "a", "c", "a, c"]),
    ],
)
def test_arguments_in_order_leave_out_only_optional_ones(tokenizer, required, written, refused):
    items = [(lark.literal(name), needed) for name, needed in zip("abc", required, strict=True)]
    body = lark.in_order(items, lark.literal(", ")) or '""'
    grammar = Grammar(tokenizer, lark.grammar(f"{body} {lark.literal('.')}"))
    assert all(accepts(tokenizer, grammar, f"{text}.") for text in written)
    assert not any(accepts(tokenizer, grammar, f"{text}.") for text in refused)


def test_a_format_without_a_writer_is_a_400_when_forced_and_free_under_auto(tokenizer):
    """A format new to mlx-lm registers with no writer: a forced call cannot be written in
    it (a 400 naming tool_choice), and its calls under auto stay free."""
    from mlxserve.postprocess.output import ChatMarkup
    from mlxserve.postprocess.tools import ToolFormat
    from mlxserve.protocol.errors import ServiceError
    from mlxserve.protocol.request import ChatRequest, Tool, ToolChoice
    from mlxserve.service.grammars import chat_grammar

    fmt = ToolFormat("brand_new", "<call>", "</call>", lambda text, tools: {})
    markup = ChatMarkup(harmony=False, think=None, tool_format=fmt)
    tools = (Tool("get_time", "The time.", {"type": "object", "properties": {}}),)
    forced = ChatRequest(tools=tools, tool_choice=ToolChoice("required"))
    with pytest.raises(ServiceError) as refused:
        chat_grammar(forced, tokenizer, [], markup, guide_calls=True)
    assert refused.value.param == "tool_choice"
    assert "(brand_new)" in str(refused.value)
    assert chat_grammar(ChatRequest(tools=tools), tokenizer, [], markup, guide_calls=True) is None

"""What requests tell the chat template, checked on the rendered prompt (no model needed)."""

from __future__ import annotations

import pytest

from mlxserve.api.openai.requests import ChatRequest, chat_request
from mlxserve.api.wire import validate
from mlxserve.chat.templates import render_chat
from mlxserve.models.tokenizer import load_text_tokenizer
from mlxserve.protocol.errors import ServiceError

EFFORT_TEMPLATE = (
    "{{ 'effort=' + (reasoning_effort | default('none')) + ';' }}"
    "{% for m in messages %}{{ m.role + ':' + m.content + ';' }}"
    "{% if m.reasoning_content %}{{ 'reasoning:' + m.reasoning_content + ';' }}{% endif %}"
    "{% for c in m.tool_calls or [] %}{{ 'call:' + c.function.name + '=' + (c.function.arguments | tojson) + ';' }}{% endfor %}"
    "{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_text_tokenizer(tiny_model, trust_remote_code=False)


def render(tokenizer, template=None, **body) -> str:
    request = validate(ChatRequest, {"messages": [{"role": "user", "content": "Hi"}], **body})
    return tokenizer.decode(render_chat(tokenizer, chat_request(request), {}, template))


def test_reasoning_effort_reaches_the_template(tokenizer):
    assert render(tokenizer, EFFORT_TEMPLATE).startswith("effort=none;")
    assert render(tokenizer, EFFORT_TEMPLATE, reasoning_effort="High").startswith("effort=high;")
    system = [
        {"role": "system", "content": "Be brief.\nReasoning: low"},
        {"role": "user", "content": "Hi"},
    ]
    assert render(tokenizer, EFFORT_TEMPLATE, messages=system).startswith("effort=low;")
    kwargs = {"reasoning_effort": "medium"}
    assert render(tokenizer, EFFORT_TEMPLATE, chat_template_kwargs=kwargs).startswith(
        "effort=medium;"
    )


def test_invalid_reasoning_effort_is_a_400():
    with pytest.raises(ServiceError) as error:
        validate(
            ChatRequest, {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"}
        )
    assert error.value.param == "reasoning_effort"


def test_enable_thinking_reaches_the_template(tokenizer):
    assert render(tokenizer).endswith("<|im_start|>assistant\n")
    assert render(tokenizer, enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    off = {"enable_thinking": False}
    assert render(tokenizer, chat_template_kwargs=off).endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking", "inline"])
def test_reasoning_in_assistant_history(tokenizer, field):
    assistant = {"role": "assistant", "content": "Four."}
    if field == "inline":
        assistant["content"] = "<think>\nTwo and two.\n</think>\n\nFour."
    else:
        assistant[field] = "Two and two."
    messages = [
        {"role": "user", "content": "2+2?"},
        assistant,
        {"role": "user", "content": "Sure?"},
    ]
    prompt = render(tokenizer, EFFORT_TEMPLATE, messages=messages)
    assert "assistant:Four.;reasoning:Two and two.;" in prompt


def test_tool_call_arguments_reach_the_template_as_objects(tokenizer):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    prompt = render(tokenizer, EFFORT_TEMPLATE, messages=messages)
    assert 'call:f={"a": 1};' in prompt
    assert "tool:done;" in prompt


def test_raw_harmony_history_is_split(tokenizer):
    raw = "<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final<|message|>Four."
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": raw},
        {"role": "user", "content": "Sure?"},
    ]
    prompt = render(tokenizer, EFFORT_TEMPLATE, messages=messages)
    assert "assistant:Four.;reasoning:Two and two.;" in prompt


def test_tool_signature_and_literals():
    from conversations import WEATHER_TOOL

    from mlxserve.chat.tool_prompt import python_literal, signature

    assert signature(WEATHER_TOOL) == (
        "def get_weather(city: str):\n"
        '    """Get the current weather in a city.\n\n'
        "    Args:\n        city: The city name.\n"
        '    """'
    )
    assert python_literal({"a": [True, None, 1.5, "x"]}) == '{"a": [True, None, 1.5, "x"]}'


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('get_weather(city="Paris")', [{"city": "Paris"}]),
        ('get_weather("Paris")', [{"city": "Paris"}]),
        ("get_weather --city 'New York'", [{"city": "New York"}]),
        ("get_weather --city=Rome", [{"city": "Rome"}]),
        ("get_weather Paris\nget_weather city=Oslo", [{"city": "Paris"}, {"city": "Oslo"}]),
    ],
)
def test_tool_code_call_styles(text, calls):
    from conversations import WEATHER_TOOL

    from mlxserve.postprocess.tools.tool_code import parse_tool_call

    parsed = parse_tool_call(text, [WEATHER_TOOL])
    assert [c["name"] for c in parsed] == ["get_weather"] * len(calls)
    assert [c["arguments"] for c in parsed] == calls


def test_tool_code_with_too_many_positional_arguments_is_refused():
    from conversations import WEATHER_TOOL

    from mlxserve.postprocess.tools.tool_code import parse_tool_call

    with pytest.raises(ValueError):
        parse_tool_call('get_weather("Paris", "France")', [WEATHER_TOOL])


def test_tool_code_mixed_styles():
    from conversations import WEATHER_TOOL

    from mlxserve.postprocess.tools.tool_code import parse_tool_call

    parsed = parse_tool_call('get_weather("London")\nget_weather --city Rome', [WEATHER_TOOL])
    assert [c["arguments"] for c in parsed] == [{"city": "London"}, {"city": "Rome"}]

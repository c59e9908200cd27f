"""Recorded model text for every tool-call format: "Let me check." then one call to
get_weather(city="Paris"), in the format's own markup."""

SAMPLES = {
    "tool_code": '```tool_code\nget_weather(city="Paris")\n```',
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "glm47": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "laguna": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    ),
    "kimi_k3": (
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>"
    ),
    "longcat": (
        "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
        "<longcat_arg_value>Paris</longcat_arg_value>\n</longcat_tool_call>"
    ),
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param></function>',
    "minimax_m2": (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        "</invoke>\n</minimax:tool_call>"
    ),
    "muse_spark": (
        '<atem:function_calls><atem:invoke name="get_weather">'
        '<atem:parameter name="city">Paris</atem:parameter></atem:invoke></atem:function_calls>'
    ),
}

# Two parameters, for formats whose arguments stream before the call closes: the text up to
# the end of the first parameter, and the rest.
FORECAST_TOOL = {
    "type": "function",
    "function": {
        "name": "forecast",
        "description": "The weather forecast.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
STREAMING_SAMPLES = {
    "json_tools": (
        '<tool_call>\n{"name": "forecast", "arguments": {"city": "Paris"',
        ', "days": 3}}\n</tool_call>',
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=forecast>\n<parameter=city>\nParis\n</parameter>\n",
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    ),
    "glm47": (
        "<tool_call>forecast\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    ),
    "longcat": (
        "<longcat_tool_call>forecast\n<longcat_arg_key>city</longcat_arg_key>\n"
        "<longcat_arg_value>Paris</longcat_arg_value>\n",
        "<longcat_arg_key>days</longcat_arg_key>\n<longcat_arg_value>3</longcat_arg_value>\n"
        "</longcat_tool_call>",
    ),
    "minimax_m2": (
        '<minimax:tool_call>\n<invoke name="forecast">\n<parameter name="city">Paris</parameter>\n',
        '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
    ),
    "minicpm5": (
        '<function name="forecast"><param name="city">Paris</param>',
        '<param name="days">3</param></function>',
    ),
    "muse_spark": (
        '<atem:function_calls><atem:invoke name="forecast">'
        '<atem:parameter name="city">Paris</atem:parameter>',
        '<atem:parameter name="days">3</atem:parameter></atem:invoke></atem:function_calls>',
    ),
    "kimi_k3": (
        '<|open|>tools<|sep|><|open|>call tool="forecast" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>',
        '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
    ),
    "laguna": (
        "<tool_call>forecast<arg_key>city</arg_key><arg_value>Paris</arg_value>",
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    ),
    "mistral": ('[TOOL_CALLS]forecast[ARGS]{"city": "Paris"', ', "days": 3}'),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.forecast:0"
        '<|tool_call_argument_begin|>{"city": "Paris"',
        ', "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    "pythonic": ('<|tool_call_start|>[forecast(city="Paris", ', "days=3)]<|tool_call_end|>"),
    "tool_code": ('```tool_code\nforecast(city="Paris", ', "days=3)\n```"),
    "gemma4": ('<|tool_call>call:forecast{city:<|"|>Paris<|"|>,', "days:3}<tool_call|>"),
    "function_gemma": (
        "<start_function_call>call:forecast{city:<escape>Paris<escape>,",
        "days:3}<end_function_call>",
    ),
}

# Blocks that hold two calls.
TWO_CALLS = {
    "mistral": '[TOOL_CALLS]forecast[ARGS]{"city": "Paris", "days": 3}forecast[ARGS]{"city": "Rome", "days": 5}',
    "kimi_k2": (
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.forecast:0<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        '<|tool_call_begin|>functions.forecast:1<|tool_call_argument_begin|>{"city": "Rome", "days": 5}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    ),
    "pythonic": '<|tool_call_start|>[forecast(city="Paris", days=3), forecast(city="Rome", days=5)]<|tool_call_end|>',
    "tool_code": '```tool_code\nforecast(city="Paris", days=3)\nforecast(city="Rome", days=5)\n```',
    "minimax_m2": (
        '<minimax:tool_call>\n<invoke name="forecast">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="forecast">\n'
        '<parameter name="city">Rome</parameter>\n<parameter name="days">5</parameter>\n</invoke>\n'
        "</minimax:tool_call>"
    ),
}

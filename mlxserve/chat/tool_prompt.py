"""Tools for chat templates that cannot render them (Gemma 3 and the like).

The tools go into the first user turn as Python signatures with docstrings; the model
calls them in ```tool_code blocks and gets results back in ```tool_output blocks. Such
templates also insist on strict user/assistant alternation, so turns of the same role are
merged, and system text is folded into the first user turn when there is no system role.
"""

from __future__ import annotations

import json
from functools import lru_cache

from jinja2 import Environment, TemplateError, meta

PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
}

INSTRUCTIONS = (
    "You can call the functions below. To call them, answer with a ```tool_code block "
    "holding one Python call per line, for example:\n"
    '```tool_code\nget_weather(city="Paris")\n```\n'
    "The results come back in a ```tool_output block.\n\n"
)


def injects_tools(tokenizer, chat_template: str | None, tools: list[dict] | None) -> bool:
    """Whether this request's tools must go into the prompt: the template knows none."""
    template = chat_template or tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one renders chats
        template = template.get("default")
    return bool(tools) and not (isinstance(template, str) and _reads_tools(template))


@lru_cache(maxsize=16)
def _reads_tools(template: str) -> bool:
    """Whether the template uses a `tools` variable (comments and text do not count)."""
    try:
        environment = Environment(extensions=["jinja2.ext.loopcontrols"])
        return "tools" in meta.find_undeclared_variables(environment.parse(template))
    except TemplateError:
        return "tools" in template


def inject_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation rewritten for a template without tool support."""
    out = [_plain(message) for message in messages]
    first_user = next((m for m in out if m["role"] == "user"), None)
    preamble = INSTRUCTIONS + "```python\n" + "\n\n".join(map(signature, tools)) + "\n```"
    if first_user is None:
        out.insert(0, {"role": "user", "content": preamble})
    else:
        first_user["content"] = joined(preamble, first_user["content"])
    return _merge_same_roles(out)


def strict_alternation(messages: list[dict]) -> list[dict]:
    """For templates that insist on user/assistant turns: system text folded into the
    first user turn, consecutive turns of one role merged."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [m for m in messages if m["role"] != "system"]
    if system:
        rest.insert(0, {"role": "user", "content": system})
    return _merge_same_roles(rest)


def _plain(message: dict) -> dict:
    """A message with tool calls and tool results written out as text blocks."""
    if message["role"] == "tool":
        return {"role": "user", "content": f"```tool_output\n{message['content']}\n```"}
    if message["role"] == "assistant" and message.get("tool_calls"):
        calls = "\n".join(_call_text(call["function"]) for call in message["tool_calls"])
        content = message.get("content") or ""
        block = f"```tool_code\n{calls}\n```"
        return {"role": "assistant", "content": f"{content}\n{block}" if content else block}
    return {k: v for k, v in message.items() if k in ("role", "content")}


def _merge_same_roles(messages: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {
                **merged[-1],
                "content": joined(merged[-1]["content"], message["content"]),
            }
        else:
            merged.append(dict(message))
    return merged


def joined(first: str | list, second: str | list) -> str | list:
    """Two message contents as one: text, or a list of parts when either holds images."""
    if isinstance(first, str) and isinstance(second, str):
        return first + "\n\n" + second
    return [*_parts(first), *_parts(second)]


def _parts(content: str | list) -> list:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def signature(tool: dict) -> str:
    """A tool as a Python function signature with a docstring."""
    function = tool.get("function", tool)
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    args = []
    for name, schema in properties.items():
        arg = f"{name}: {PY_TYPES.get(schema.get('type'), 'Any')}"
        args.append(arg if name in required else f"{arg} = None")
    lines = [
        f"def {function['name']}({', '.join(args)}):",
        '    """' + function.get("description", ""),
    ]
    if properties:
        lines += ["", "    Args:"]
        lines += [
            f"        {n}: {s.get('description', '')}".rstrip() for n, s in properties.items()
        ]
    lines.append('    """')
    return "\n".join(lines)


def _call_text(function: dict) -> str:
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    pairs = ", ".join(f"{k}={python_literal(v)}" for k, v in arguments.items())
    return f"{function['name']}({pairs})"


def python_literal(value) -> str:
    """A JSON value written as a Python literal."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(python_literal, value)) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{python_literal(k)}: {python_literal(v)}" for k, v in value.items())
            + "}"
        )
    return repr(value)

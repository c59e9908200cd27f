"""Calls written in ```tool_code blocks, for tools injected into the prompt.

Models write Python calls (`get_weather(city="Paris")`), positional ones
(`get_weather("Paris")`) or shell-style ones (`get_weather --city Paris`); positional
values are mapped to the tool's parameter names in schema order.
"""

from __future__ import annotations

import ast
import json
import shlex

JSON_NAMES = {"true": True, "false": False, "null": None}

tool_call_start = "```tool_code"
tool_call_end = "```"


def parse_tool_call(text: str, tools: list[dict] | None = None) -> list[dict]:
    params = _parameter_names(tools or [])
    try:
        calls = _python_calls(text.strip(), params)
    except SyntaxError:  # one call per line, each Python or shell-style
        calls = []
        for line in filter(str.strip, text.strip().splitlines()):
            try:
                calls += _python_calls(line, params)
            except SyntaxError:
                calls.append(_shell_call(line, params))
    if not calls:
        raise ValueError("empty tool_code block")
    return calls


def _python_calls(source: str, params: dict[str, list[str]]) -> list[dict]:
    calls = []
    for statement in ast.parse(source).body:
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            raise ValueError(f"not a function call: {ast.unparse(statement)}")
        call = statement.value
        name = ast.unparse(call.func)
        arguments = {kw.arg: _value(kw.value) for kw in call.keywords}
        arguments |= _positional(name, [_value(a) for a in call.args], params)
        calls.append({"name": name, "arguments": arguments})
    return calls


def _value(node: ast.expr):
    try:
        return ast.literal_eval(_JsonNames().visit(node))
    except ValueError:
        return ast.unparse(node)  # a bare name or expression: keep its text


class _JsonNames(ast.NodeTransformer):
    """Models write JSON's true, false and null in calls too (and forced calls are written
    in JSON): read them as Python's."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.Constant(JSON_NAMES[node.id]) if node.id in JSON_NAMES else node


def _shell_call(line: str, params: dict[str, list[str]]) -> dict:
    name, *words = shlex.split(line)
    arguments: dict = {}
    positional = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and "=" in word:
            key, value = word[2:].split("=", 1)
            arguments[key] = _scalar(value)
        elif word.startswith("--") and i + 1 < len(words):
            arguments[word[2:]] = _scalar(words[i + 1])
            i += 1
        elif "=" in word:
            key, value = word.split("=", 1)
            arguments[key] = _scalar(value)
        else:
            positional.append(_scalar(word))
        i += 1
    return {"name": name, "arguments": arguments | _positional(name, positional, params)}


def _scalar(word: str):
    try:
        return json.loads(word)
    except json.JSONDecodeError:
        return word


def _positional(name: str, values: list, params: dict[str, list[str]]) -> dict:
    names = params.get(name, [])
    if len(values) > len(names):
        raise ValueError(f"{name} got {len(values)} positional arguments for parameters {names}")
    return dict(zip(names, values, strict=False))


def _parameter_names(tools: list[dict]) -> dict[str, list[str]]:
    out = {}
    for tool in tools:
        function = tool.get("function", tool)
        out[function["name"]] = list((function.get("parameters") or {}).get("properties", {}))
    return out

"""Request bodies for every dialect: JSON -> validated wire models, so every mistake is a
400 naming its field before anything runs.

Pydantic in strict mode does the checking: a string where a number belongs is refused
(as OpenAI and Anthropic do), an int is fine where a float belongs, unknown fields are
ignored."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from mlxserve.protocol.errors import bad_request
from mlxserve.protocol.request import ToolChoice, ToolChoiceMode


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


Verbosity = Literal["low", "medium", "high"]
# Our extension field of the OpenAI dialects: "off" leaves a request's tool calls unguided
# under tool_choice "auto" (see --tool-call-grammar).
ToolCallGrammar = Literal["auto", "off"]


def as_written(verbosity: Verbosity | None) -> Verbosity | None:
    """OpenAI's models write shorter or longer answers by `verbosity`; a model here has no
    such switch: "medium" (OpenAI's default) is how it writes, the others are refused."""
    if verbosity not in (None, "medium"):
        raise ValueError(
            "only 'medium' is served: the model has no switch for shorter or longer answers"
        )
    return verbosity


# Pydantic names union members in error locations ('str', 'list[str]', 'ContentPart'...).
_TYPE_TAG = re.compile(r"^([A-Z]\w*|str|int|float|bool|dict|list|function-\w+)(\[.*\])?$")


def _param(loc: tuple) -> str:
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _TYPE_TAG.match(part):
            param += f".{part}" if param else part
    return param


def parse_json_body(raw: bytes) -> dict:
    """Decode a body into a JSON object, or raise a 400."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad_request(f"The request body is not valid UTF-8: {e}") from e
    except RecursionError as e:
        raise bad_request("The request body is nested too deeply.") from e
    except ValueError as e:  # not JSON, or an integer too long to convert
        raise bad_request(f"The request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _check_depth(body)
    try:  # JSON may escape lone UTF-16 surrogates ("\ud800"), which are not Unicode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_request(f"The request body is not valid Unicode: {e.reason}.") from e
    return body


# Deeper than any schema, template argument or tool input a client means: the fields the
# core walks recursively (schemas to grammars, kwargs into templates) stay far from
# Python's recursion limit.
MAX_DEPTH = 64
_NAMED_SEGMENTS = 4  # a too-deep value is named by the first segments of its path


def _check_depth(body: dict) -> None:
    """A 400 naming the field whose value nests deeper than MAX_DEPTH (walked without
    recursion, so no nesting can exhaust the stack here either)."""
    stack: list[tuple[Any, tuple, int]] = [(body, (), 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            field = "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" if i else part
                for i, part in enumerate(path[:_NAMED_SEGMENTS])
            )
            raise bad_request(f"'{field}' nests deeper than {MAX_DEPTH} levels.", param=field)
        if isinstance(value, dict):
            stack += [(v, (*path, str(k)), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, (*path, i), depth + 1) for i, v in enumerate(value)]


def validate(model: type[BaseModel], body: dict, context: dict | None = None) -> Any:
    """Validate a decoded body into `model`, turning the first problem into a 400.
    `context`: what the model's validators may read of how it came (a WebSocket warm-up)."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        param = _param(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        raise bad_request(f"Invalid value for '{param}': {message}.", param=param) from e


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """A request body as a validated wire model."""
    return validate(model, parse_json_body(raw))


def check_tool_choice(value: Any, name_of: Callable[[dict], Any], shape: str) -> Any:
    """A wire tool_choice: a mode, or an object naming one function. `name_of` finds the
    name where the dialect puts it; `shape` says that object's shape in the error."""
    if isinstance(value, dict):
        if value.get("type") != "function" or not isinstance(name_of(value), str):
            raise ValueError(shape)
    elif value not in (None, *get_args(ToolChoiceMode)):
        raise ValueError("must be 'auto', 'none', 'required' or a named function")
    return value


def tool_choice(value: str | dict | None, name_of: Callable[[dict], str]) -> ToolChoice:
    """A checked wire tool_choice as the neutral one: a named function is required."""
    if isinstance(value, dict):
        return ToolChoice("required", name_of(value))
    return ToolChoice(cast(ToolChoiceMode, value or "auto"))

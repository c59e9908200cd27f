"""How a setting is declared: once, as a field of the configuration with its default, help,
group and how its text is read. The command line, `config_from_args`, the --config file's
keys and docs/cli.md are all made from these declarations (see cli.py), so a new setting is
one field and nothing else."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

from jinja2 import TemplateError, TemplateSyntaxError

from mlxserve.compat import compile_chat_template

# How a setting given several times is gathered: "repeat" (the flag again) or "comma" (one
# comma-separated value); either way the configuration holds a tuple.
Many = Literal["repeat", "comma"]


@dataclass(frozen=True)
class Option:
    """A setting's command-line face."""

    help: str
    group: str
    flag: str | None = None  # None: --the-field-name
    parse: Callable[[str], Any] | None = None  # None: the default's own type, else text
    # Allowed values: a tuple, or the name of a catalog the command line knows (parsers,
    # formats: lists owned by the packages that implement them)
    choices: tuple[Any, ...] | str | None = None
    many: Many | None = None
    env: str | None = None  # an environment variable giving the default
    metavar: str | None = None
    shown_default: str | None = None  # the default as the docs say it, when not the value


def setting(default: Any = MISSING, *, factory: Any = MISSING, **option: Any) -> Any:
    """A configuration field declared with its Option."""
    meta = {"option": Option(**option)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """One declared setting: where it sits in the configuration and its Option."""

    path: tuple[str, ...]  # field names from the top: ("defaults", "temperature")
    option: Option
    default: Any

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.path[-1].replace("_", "-")

    @property
    def metavar(self) -> str:
        return self.option.metavar or self.flag[2:].upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return "_".join(self.path)

    @property
    def is_switch(self) -> bool:
        return isinstance(self.default, bool)

    def read(self, text: str) -> Any:
        """One value of this setting from its text."""
        if self.option.parse is not None:
            return self.option.parse(text)
        kind = type(self.default)
        return kind(text) if kind in (int, float) else text


def declared(cls: type, path: tuple[str, ...] = ()) -> Iterator[Declared]:
    """Every setting of a configuration class, nested ones (a dataclass-valued field
    without an Option of its own) in place, in declaration order."""
    instance = cls()
    for f in fields(cls):
        value = getattr(instance, f.name)
        option = f.metadata.get("option")
        if option is not None:
            yield Declared((*path, f.name), option, value)
        elif is_dataclass(value):
            yield from declared(type(value), (*path, f.name))


# Readers of a setting's text, for Option.parse. They raise argparse's error so that the
# command line names the flag and the value.


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def name_pair(text: str) -> tuple[str, str]:
    """NAME=MODEL."""
    name, sep, model = text.partition("=")
    if not sep or not name.strip() or not model.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=MODEL, not {text!r}")
    return name.strip(), model.strip()


@dataclass(frozen=True)
class LoraOption:
    """--lora NAME=PATH[@MODEL]: an adapter, and the served model it applies to (None:
    the default model)."""

    name: str
    path: Path
    model: str | None = None


def lora_option(text: str) -> LoraOption:
    """NAME=PATH[@MODEL]; a PATH that exists as written is a path, even with an @ in it."""
    name, sep, rest = text.partition("=")
    folder, at, model = rest.rpartition("@")
    if not at or Path(rest).expanduser().exists():
        folder, model = rest, ""
    if not sep or not name.strip() or not folder.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=PATH[@MODEL], not {text!r}")
    return LoraOption(name.strip(), Path(folder.strip()).expanduser(), model.strip() or None)


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def chat_template(value: str) -> str:
    """Jinja text (it has {{ or {%), else the path of a file holding it; a path that names
    no file is an error, not a template that prints the path, and so is a template that
    does not compile. Stops the program: a --config file's templates are read here too."""
    text = value
    if "{{" not in value and "{%" not in value:
        path = Path(value).expanduser()
        try:
            found = path.is_file()
        except (OSError, ValueError):  # a name too long, a NUL byte
            found = False
        if not found:
            raise SystemExit(
                f"mlxserve: --chat-template {value!r} is neither a file nor a template"
            )
        text = path.read_text()
    try:
        compile_chat_template(text)
    except TemplateError as e:
        line = f" (line {e.lineno})" if isinstance(e, TemplateSyntaxError) else ""
        raise SystemExit(f"mlxserve: the chat template does not compile{line}: {e}") from e
    return text

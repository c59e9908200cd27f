"""--config FILE: the served models and their own settings, in TOML.

[[models]]
model = "mlx-community/Qwen3-4B-4bit"   # a hub repo id or a folder (required)
name = "qwen"                            # the name clients use (default: model)
aliases = ["claude-*", "gpt-4o"]         # more names; "*" at the end matches a prefix
chat_template = "qwen.jinja"             # a file (relative to this one) or Jinja text
chat_template_args = { enable_thinking = false }
reasoning_parser = "think"
tool_parser = "hermes"
draft_model = "mlx-community/Qwen3-0.6B-4bit"
max_context = 32768
pin = true
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from mlxserve.config import ModelSettings
from mlxserve.settings import chat_template

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

KEYS = {f.name for f in fields(ModelSettings)}


def load_models(path: Path) -> tuple[ModelSettings, ...]:
    """The [[models]] of a TOML file (its keys: ModelSettings' fields). Any mistake stops
    the server with a message naming it."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"mlxserve: --config {path}: {e}") from e
    unknown = set(data) - {"models"}
    entries = data.get("models", [])
    if unknown or not isinstance(entries, list):
        raise SystemExit(f"mlxserve: --config {path}: only [[models]] tables belong here")
    return tuple(_entry(path, i, entry) for i, entry in enumerate(entries))


def _entry(path: Path, index: int, entry: dict) -> ModelSettings:
    where = f"mlxserve: --config {path}: models[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        raise SystemExit(f"{where} needs a 'model' (a hub repo id or a folder)")
    if unknown := sorted(set(entry) - KEYS):
        raise SystemExit(f"{where}: unknown setting {', '.join(unknown)}")
    values = dict(entry)
    if "aliases" in values:
        aliases = values["aliases"]
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise SystemExit(f"{where}: aliases must be a list of names")
        values["aliases"] = tuple(aliases)
    if "chat_template" in values:
        relative = path.parent / values["chat_template"]
        values["chat_template"] = chat_template(
            str(relative) if relative.is_file() else values["chat_template"]
        )
    folder = path.parent / values["model"]
    if folder.is_dir():
        values["model"] = str(folder.resolve())
        values.setdefault("name", entry["model"])
    try:
        return ModelSettings(**values)
    except TypeError as e:
        raise SystemExit(f"{where}: {e}") from e

"""docs/cli.md, written from the settings' declarations: `make docs` writes it, and a test
fails when the page in the tree is not what the declarations say."""

from __future__ import annotations

from pathlib import Path

from mlxserve.cli import choices
from mlxserve.config import CONFIG_FILE, GROUPS, PER_MODEL, ModelSettings, ServerConfig
from mlxserve.settings import Declared, declared

PAGE = Path(__file__).parents[1] / "docs" / "cli.md"

HEADER = """# Command line

`mlxserve --help` says the same. This page is generated from the settings' declarations in
`mlxserve/config.py` by `make docs`; do not edit it by hand.

`mlxserve launch CLIENT` starts a coding agent (Claude Code, Codex, OpenCode, Qwen Code,
aider, cn) against a server
([agents](agents.md)); `mlxserve pull|ls|rm` manage models on this machine
([models](models.md)); `mlxserve keys create|list|revoke|usage` manage API keys, their
limits and usage ([sharing a server](keys.md)).
"""


def render() -> str:
    settings = list(declared(ServerConfig))
    parts = [HEADER]
    for group in GROUPS:
        parts.append(f"\n## {group}\n\n| Flag | Default | |\n|---|---|---|\n")
        parts.extend(_row(s) for s in settings if s.option.group == group)
    parts.append(f"\n## {CONFIG_FILE}\n\n")
    parts.append(
        "`--config models.toml` serves the `[[models]]` it lists after the `--model` ones. "
        "Each entry takes these keys:\n\n| Key | |\n|---|---|\n"
    )
    flags = {s.path[-1]: s.flag for s in settings}
    for s in declared(ModelSettings):
        parts.append(f"| `{s.path[-1]}` | {_cell(s.option.help)} |\n")
    for key in ("draft_model", *PER_MODEL):
        parts.append(f"| `{key}` | as `{flags[key]}`, for this model |\n")
    return "".join(parts)


def _row(setting: Declared) -> str:
    flag = setting.flag
    allowed = choices(setting)
    if allowed is not None:
        flag += " {" + ",".join(str(c) for c in allowed) + "}"
    elif not setting.is_switch:
        flag += " " + setting.metavar
    return f"| `{flag}` | {_default(setting)} | {_cell(setting.option.help)} |\n"


def _default(setting: Declared) -> str:
    option = setting.option
    if option.env:
        return f"`${option.env}`"
    if option.shown_default is not None:  # words, not a value
        return option.shown_default
    value = setting.default
    if value is None or setting.is_switch or value == ():
        return ""
    if option.many == "comma":
        value = ",".join(value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":  # make docs
    PAGE.write_text(render())

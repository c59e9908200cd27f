"""One source of defaults: the command line's are ServerConfig's, and the README's table of
flags says the same."""

from __future__ import annotations

import re
from pathlib import Path

from mlxserve.cli import config_from_args, parser
from mlxserve.config import ServerConfig

README = Path(__file__).parents[2] / "README.md"
# Flags whose default is not the parser's: the demo model when none is named, the key
# from the environment.
OTHERWISE = {
    "--model": ServerConfig().model,
    "--api-key": "$MLXSERVE_API_KEY",
    "--secret-key": "$MLXSERVE_SECRET_KEY",
}
ROW = re.compile(r"^\| `(--[a-z-]+)` \| `([^`|]+)` \|", re.MULTILINE)


def test_the_command_line_defaults_are_the_configs(monkeypatch):
    monkeypatch.delenv("MLXSERVE_API_KEY", raising=False)
    monkeypatch.delenv("MLXSERVE_SECRET_KEY", raising=False)
    assert config_from_args(parser().parse_args([])) == ServerConfig()


def test_the_readme_table_gives_the_command_line_defaults(monkeypatch):
    monkeypatch.delenv("MLXSERVE_API_KEY", raising=False)
    monkeypatch.delenv("MLXSERVE_SECRET_KEY", raising=False)
    defaults = vars(parser().parse_args([]))
    rows = ROW.findall(README.read_text())
    assert len(rows) > 15  # the table is still where this test looks
    wrong = []
    for flag, written in rows:
        default = OTHERWISE.get(flag, defaults[flag[2:].replace("-", "_")])
        number = _number(written)
        if str(default) != written and (number is None or number != default):
            wrong.append(f"{flag}: README {written!r}, code {default!r}")
    assert not wrong, wrong


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None

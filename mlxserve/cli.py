"""Command line -> ServerConfig, logging, and the server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mlxserve import __version__
from mlxserve.config import GROUPS, SamplingDefaults, ServerConfig
from mlxserve.config_file import load_models
from mlxserve.distributed.world import MODES
from mlxserve.postprocess import reasoning, tools
from mlxserve.settings import Declared, declared
from mlxserve.telemetry.record import RequestIdFilter

# Lists of allowed values owned by the packages that implement them (Option.choices names
# one).
CATALOGS: dict[str, Callable[[], Sequence[str]]] = {
    "reasoning formats": lambda: reasoning.FORMATS,
    "reasoning parsers": lambda: [*sorted(reasoning.TAGS_BY_NAME), "harmony"],
    "tool parsers": lambda: [*tools.names(), "harmony"],
    "distributed modes": lambda: MODES,
}


def choices(setting: Declared) -> Sequence[Any] | None:
    wanted = setting.option.choices
    return CATALOGS[wanted]() if isinstance(wanted, str) else wanted


def parser() -> argparse.ArgumentParser:
    """The command line, one flag per declared setting of ServerConfig."""
    p = argparse.ArgumentParser(
        prog="mlxserve", description="An OpenAI-compatible HTTP server for MLX models."
    )
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    for setting in declared(ServerConfig):
        _add(groups[setting.option.group], setting)
    p.add_argument("--version", action="version", version=f"mlxserve {__version__}")
    return p


def _add(group: argparse._ArgumentGroup, setting: Declared) -> None:
    option = setting.option
    text = option.help.replace("%", "%%")  # argparse formats help with %
    if setting.is_switch:  # --flag sets True; a setting on by default is a --no-flag
        action = "store_false" if setting.default else "store_true"
        group.add_argument(setting.flag, dest=setting.dest, action=action, help=text)
        return
    default = os.environ.get(option.env) if option.env else None
    if option.many == "comma" and setting.default is not None:
        default = ",".join(setting.default)
    elif option.many is None and setting.default is not None:
        default = setting.default
    group.add_argument(
        setting.flag,
        dest=setting.dest,
        action="append" if option.many == "repeat" else "store",
        type=setting.read if option.many != "comma" else str,
        choices=choices(setting),
        default=default,
        metavar=None if option.choices else setting.metavar,
        help=text,
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The parsed command line as a ServerConfig: every declared setting from its flag, and
    the --config file's models after the --model ones."""
    values: dict[str, Any] = {}
    for setting in declared(ServerConfig):
        value = getattr(args, setting.dest)
        if setting.option.many == "comma" and value is not None:
            value = tuple(setting.read(name.strip()) for name in value.split(",") if name.strip())
        elif setting.option.many == "repeat":
            value = tuple(value or ())
        elif setting.option.env:
            value = value or None  # an empty variable sets nothing
        values[setting.dest] = value
    sampling = {s.path[-1]: values.pop(s.dest) for s in declared(SamplingDefaults, ("defaults",))}
    path = values["config_file"]
    from_file = load_models(path) if path is not None else ()
    values["models"] = values["models"] + from_file or ServerConfig().models
    return ServerConfig(defaults=SamplingDefaults(**sampling), **values)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["launch"]:  # mlxserve launch CLIENT: see agents/launch.py
        from mlxserve.agents.launch import main as launch

        sys.exit(launch(argv[1:]))
    if argv[:1] == ["keys"]:  # API keys, their limits and usage: see keys/commands.py
        from mlxserve.keys.commands import main as keys

        sys.exit(keys(argv[1:]))
    if argv[:1] in (["pull"], ["ls"], ["rm"]):  # models on this machine: see hub/commands.py
        from mlxserve.hub.commands import main as models

        sys.exit(models(argv))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    config = config_from_args(parser().parse_args(argv))
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())  # lines written while answering carry its id
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(request)s%(message)s",
        handlers=[handler],
    )
    from mlxserve.server import run

    run(config)

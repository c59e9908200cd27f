"""One declaration per setting: the command line's defaults are ServerConfig's, and
docs/cli.md is what the declarations say."""

from __future__ import annotations

import pytest

from mlxserve.cli import config_from_args, parser
from mlxserve.cli_docs import PAGE, render
from mlxserve.config import ModelSettings, ServerConfig
from mlxserve.settings import declared


@pytest.fixture(autouse=True)
def no_keys_in_the_environment(monkeypatch):
    monkeypatch.delenv("MLXSERVE_API_KEY", raising=False)
    monkeypatch.delenv("MLXSERVE_SECRET_KEY", raising=False)


def test_the_command_line_defaults_are_the_configs():
    assert config_from_args(parser().parse_args([])) == ServerConfig()


def test_every_flag_reaches_its_setting(tmp_path):
    models = tmp_path / "models.toml"
    models.write_text('[[models]]\nmodel = "b"\nname = "bee"\npin = true\n')
    args = [
        *("--model", "a", "--config", str(models), "--temp", "0.7", "--top-k", "5"),
        *("--model-alias", "x*=a", "--model-dir", "/m", "--no-cached-models", "--pin"),
        *("--allowed-origins", "http://a, http://b", "--allowed-hosts", "h1,h2"),
        *("--chat-template-args", '{"enable_thinking": false}', "--kv-bits", "4"),
        *("--api-key", "", "--max-concurrent", "3", "--reasoning-parser", "think"),
    ]
    config = config_from_args(parser().parse_args(args))
    assert config.models == (ModelSettings("a"), ModelSettings("b", name="bee", pin=True))
    assert config.config_file == models
    assert (config.defaults.temperature, config.defaults.top_k) == (0.7, 5)
    assert config.defaults.max_tokens == ServerConfig().defaults.max_tokens
    assert config.model_aliases == (("x*", "a"),)
    assert [str(d) for d in config.model_dirs] == ["/m"]
    assert (config.cached_models, config.pin) == (False, True)
    assert config.allowed_origins == ("http://a", "http://b")
    assert config.allowed_hosts == ("h1", "h2")
    assert config.chat_template_args == {"enable_thinking": False}
    assert (config.kv_bits, config.max_concurrent, config.reasoning_parser) == (4, 3, "think")
    assert config.api_key is None  # an empty key sets none


def test_the_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("MLXSERVE_API_KEY", "sk-env")
    assert config_from_args(parser().parse_args([])).api_key == "sk-env"
    assert config_from_args(parser().parse_args(["--api-key", "sk-flag"])).api_key == "sk-flag"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-concurrent", "0"], "must be at least 1, not 0"),
        (["--chat-template-args", "[1]"], "must be a JSON object"),
        (["--model-alias", "nothing"], "expected NAME=MODEL"),
        (["--kv-bits", "3"], "invalid choice"),
    ],
)
def test_a_bad_value_names_its_flag(args, message, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(args)
    error = capsys.readouterr().err
    assert f"argument {args[0]}" in error and message in error, error


def test_docs_cli_md_is_what_the_declarations_say():
    assert PAGE.read_text() == render(), "docs/cli.md is stale: run `make docs`"


def test_help_lists_every_flag():
    text = parser().format_help()
    assert all(setting.flag in text for setting in declared(ServerConfig))

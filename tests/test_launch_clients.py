"""OpenCode, Qwen Code, aider and Continue's cn as they ship, each started by `mlxserve
launch CLIENT --url ... -- ARGS`: each completes a turn in its non-interactive mode against
a server that wants an API key (OpenCode, Qwen Code and cn a tool round trip: the model
asks for their shell tool, the client runs the command and sends its result back, the
model answers) and then a second session continuing the first one's conversation from
the prompt cache, every request it made answered 200, with its settings for
this server in a temporary folder that is gone when it exits, and the user's own
configuration files (each naming another model or provider) neither written nor winning.
`mlxserve launch --list` tells installed clients from the others, and each client is given
the model's context length and output limit where it reads them.

The Node CLIs are installed from npm into the cache folder once per version (as the
`agents` tier's), aider into a virtualenv of its own there."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from conversations import AGENT_REPLY, instruction
from helpers.agents import VENV_BIN, answered, npm_install, pip_install, python_between, run
from helpers.server import CHAT

from mlxserve.agents.launch import AGENTS, Served, main, output_tokens

OPENCODE = "opencode-ai@1.18.33"
QWEN_CODE = "@qwen-code/qwen-code@0.24.4"
CN = "@continuedev/cli@1.5.47"
AIDER = "aider-chat==0.86.2"  # Python 3.10 to 3.12
API_KEY = "sk-launch"
QUESTION = "What is two plus two?"
MADE = "launched.txt"  # the file the shell command of the tool round trip makes

# Each client's one non-interactive turn (its arguments after `--`; those with a shell tool
# are asked to run the command with it, and allowed to), and the user's own
# configuration in its home, naming another model or provider: the launcher's settings must
# win for the session, and these files stay as they were, byte for byte. Each is in the form
# the client itself writes: OpenCode 1.18 adds a "$schema" to a config file that has none,
# and Qwen Code rewrites a settings file without "$version": 4, however they are started.
# Qwen Code's also turns off its memory extractor (a second 19,000-token request each turn):
# the user's other settings still apply.
CLIENTS = {
    "opencode": (
        ["run", instruction("bash")],
        {
            ".config/opencode/opencode.json": json.dumps(
                {
                    "$schema": "https://opencode.ai/config.json",
                    "model": "anthropic/claude-sonnet-4-5",
                }
            )
        },
    ),
    "qwen": (
        ["--yolo", instruction("run_shell_command")],  # one turn (-p is deprecated)
        {
            ".qwen/settings.json": json.dumps(
                {
                    "security": {"auth": {"selectedType": "qwen-oauth"}},
                    "model": {"name": "coder-model"},
                    "memory": {"enableManagedAutoMemory": False},
                    "$version": 4,
                },
                indent=2,
            )
        },
    ),
    "aider": (
        ["--message", QUESTION, "--yes-always", "--no-git", "--no-auto-commits"],
        {".aider.conf.yml": "model: gpt-4o\n"},
    ),
    "cn": (
        ["-p", instruction("Bash")],
        {".continue/config.yaml": "name: mine\nversion: 1.0.0\nschema: v1\nmodels: []\n"},
    ),
}


# Each client's second session, continuing the first one's conversation.
SECOND_TURNS = {
    "opencode": ["run", "--continue", QUESTION],
    "qwen": ["--yolo", "--continue", QUESTION],  # its tools as in the first: the same prompt
    "aider": [*CLIENTS["aider"][0], "--restore-chat-history"],
    "cn": ["-p", "--resume", QUESTION],
}


@pytest.fixture(scope="session")
def clients_path() -> str:
    """PATH with the four CLIs, the virtualenv's node and mlxserve before aider's own
    virtualenv (whose python must not shadow the suite's)."""
    aider = pip_install(AIDER, python_between((3, 10), (3, 13)))
    folders = [npm_install(OPENCODE), npm_install(QWEN_CODE), npm_install(CN), VENV_BIN, aider]
    return os.pathsep.join([*map(str, folders), os.environ["PATH"]])


@pytest.fixture(scope="module")
def served(launch_module, tool_agent_model):
    """One server for every client: Qwen Code's prompt is 25,000 tokens."""
    return launch_module(tool_agent_model, "--max-context", "32768", "--api-key", API_KEY)


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_session_through_the_launcher(client, served, clients_path, tmp_path):
    """A turn (a tool round trip where the client has tools), then a second session that
    continues the conversation: its prompt holds the first one's, from the prompt cache."""
    args, user_files = CLIENTS[client]
    for name, text in user_files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    first = launched(served, client, args, clients_path, tmp_path)
    if client != "aider":  # the model's call ran, and the model was asked again after it
        assert (tmp_path / "work" / MADE).exists()
        assert len(first) >= 2, first
    second = launched(served, client, SECOND_TURNS[client], clients_path, tmp_path)
    assert max(map(prompt_tokens, second)) > max(map(prompt_tokens, first)), second
    assert cached_tokens(second[0]) > 0, second
    assert {name: (tmp_path / name).read_text() for name in user_files} == user_files


def launched(served, client: str, args: list[str], path: str, home: Path) -> list[str]:
    """Run the client through the launcher in `home`; its requests' access-log lines."""
    temp = home / "tmp"
    temp.mkdir(exist_ok=True)
    since = len(served.log)
    command = [sys.executable, "-m", "mlxserve", "launch", client, "--url", served.url]
    command += ["--api-key", API_KEY, "--", *args]
    done = run(command, home, path, TMPDIR=str(temp))
    assert done.returncode == 0, done.stdout + done.stderr
    assert AGENT_REPLY in done.stdout, done.stdout + done.stderr
    assert not list(temp.glob("mlxserve-launch-*"))  # its settings went with it
    return answered(served, CHAT, since)


def prompt_tokens(line: str) -> int:
    return int(re.search(r" prompt=(\d+)", line)[1])


def cached_tokens(line: str) -> int:
    return int(re.search(r" cached=(\d+)", line)[1])


def test_list_tells_installed_clients_from_the_others(tmp_path, monkeypatch, capsys):
    opencode = tmp_path / "opencode"
    opencode.write_text("#!/bin/sh\n")
    opencode.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert list(rows) == list(AGENTS)
    assert rows["opencode"].endswith(f"installed ({opencode})")
    for name in AGENTS.keys() - {"opencode"}:
        assert rows[name].endswith(f"not installed: {AGENTS[name].package}"), rows[name]


def given_limits(client: str, env: dict[str, str], args: list[str]) -> tuple[int, int]:
    """The context length and the output limit, read where the client reads them."""
    if client == "opencode":
        config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
        limit = config["provider"]["mlxserve"]["models"]["m"]["limit"]
        return limit["context"], limit["output"]
    if client == "qwen":
        settings = json.loads(Path(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
        generation = settings["modelProviders"]["openai"][0]["generationConfig"]
        return generation["contextWindowSize"], generation["samplingParams"]["max_tokens"]
    if client == "aider":
        metadata = _file_after(args, "--model-metadata-file")["openai/m"]
        extra = _file_after(args, "--model-settings-file")[0]["extra_params"]
        return metadata["max_input_tokens"], extra["max_tokens"]
    options = _file_after(args, "--config")["models"][0]["defaultCompletionOptions"]
    return options["contextLength"], options["maxTokens"]


def _file_after(args: list[str], flag: str):
    return json.loads(Path(args[args.index(flag) + 1]).read_text())  # YAML files hold JSON


@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_client_is_given_the_context_and_the_output_limit(client, tmp_path):
    env, args = AGENTS[client].settings(Served("http://127.0.0.1:9", "m", 40960, "k"), tmp_path)
    assert given_limits(client, env, args) == (40960, output_tokens(40960))
    written = [Path(a) for a in [*args, *env.values()] if a.startswith(str(tmp_path))]
    assert all(path.parent == tmp_path for path in written)  # the session's folder only

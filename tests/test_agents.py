"""The real coding-agent CLIs against mlxserve: installed from npm into the cache folder,
run headless for one turn against the agent fixture model. They need Node.js; without it
these tests are skipped, saying so (CI machines have it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conversations import AGENT_REPLY

from mlxserve.models.demo import cache_root

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.330"
TURN_SECONDS = 600  # a 36k-token agent prompt is processed on the CPU in about 45 s


def npm_install(package: str) -> Path:
    """The package's folder of executables, installed once per version."""
    if shutil.which("npm") is None:
        pytest.skip("Node.js (npm) is not installed: the agent CLIs cannot run")
    prefix = cache_root() / "agents" / package.replace("/", "+")
    bin_dir = prefix / "node_modules" / ".bin"
    if not bin_dir.is_dir():
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", package],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return bin_dir


@pytest.fixture(scope="session")
def claude_code() -> Path:
    return npm_install(CLAUDE_CODE) / "claude"


def test_claude_code_headless_turn(launch, agent_model, claude_code, tmp_path):
    """`claude -p` with its default model name, system prompt, tools and thinking
    settings completes a turn: the model's reply comes back, no request was refused."""
    srv = launch(agent_model, "--model-alias", "claude-*=default")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),  # a fresh Claude Code configuration
        "ANTHROPIC_BASE_URL": srv.url,
        "ANTHROPIC_API_KEY": "sk-local",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    command = [str(claude_code), "-p", "What is two plus two?", "--output-format", "json"]
    done = subprocess.run(
        [*command, "--model", "claude-sonnet-4-5"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TURN_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["terminal_reason"] == "completed"
    assert result["stop_reason"] == "end_turn"
    assert result["result"] == AGENT_REPLY
    requests = [line for line in srv.log if '"POST /v1/messages' in line]
    assert requests and all(re.search(r'" 200 model=', line) for line in requests), requests


CODEX = "@openai/codex@0.169.0"
# Codex's configuration for mlxserve, as the README gives it. Web search is a hosted tool
# the server cannot run (it answers a 400 naming it): Codex is told not to offer it.
CODEX_CONFIG = """\
model = "default"
model_provider = "mlxserve"
web_search = "disabled"

[model_providers.mlxserve]
name = "mlxserve"
base_url = "{base_url}"
wire_api = "responses"
"""


@pytest.fixture(scope="session")
def codex() -> Path:
    return npm_install(CODEX) / "codex"


def test_codex_exec_turn(launch, agent_model, codex, tmp_path):
    """`codex exec` with its own system prompt, tools (some in namespaces), reasoning
    summaries and encrypted reasoning, stateless (store: false): the turn completes with
    the model's reply and every request it made was answered 200."""
    srv = launch(agent_model)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(base_url=srv.base_url))
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "--json", "What is two plus two?"],
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TURN_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    messages = [
        e["item"]["text"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"
    ]
    assert messages == [AGENT_REPLY], done.stdout
    assert events[-1]["type"] == "turn.completed", events[-1]
    assert not [e for e in events if e["type"] in ("error", "turn.failed")]
    requests = [line for line in srv.log if '"POST /v1/responses' in line]
    assert requests and all(re.search(r'" 200 model=', line) for line in requests), requests

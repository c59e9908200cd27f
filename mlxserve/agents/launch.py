"""`mlxserve launch claude|codex [SERVER FLAGS] [-- AGENT ARGS]`: a coding agent against
mlxserve with everything set, in one command.

It uses the server at --url when one answers there, else starts one (with the server
flags given, on a free port, its log in the cache folder) and stops it when the agent
exits. From /v1/models it learns the model's name and context length, and runs the agent
with its base URL and key, its model names, output limits that fit the context, and a
context window to compact by (each agent's own settings, written once in AGENTS)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlxserve.models.demo import cache_root

DEFAULT_URL = "http://127.0.0.1:8080"
START_SECONDS = 600  # a first start may convert the demo model
API_KEY_ENV = "MLXSERVE_API_KEY"


@dataclass(frozen=True)
class Served:
    url: str  # http://host:port
    model: str  # the served model's name
    context: int  # its context length, prompt and output
    api_key: str


def output_tokens(context: int) -> int:
    """The output limit an agent is given: an eighth of the context, at most 32,000 (the
    rest is for the conversation, which an agent compacts before it fills the window
    less this)."""
    return min(32000, context // 8)


# Claude Code compacts when a conversation reaches its window less the output limit less
# 13,000 tokens, and refuses to send one within 3,000 tokens of the window: below this
# window it would refuse or compact every turn, so it is not told the window (it then
# takes its own default and runs until the server says the prompt is too long).
CLAUDE_SMALLEST_WINDOW = 24576


def claude_settings(served: Served) -> tuple[dict[str, str], list[str]]:
    """Claude Code's environment. The model goes by its own name, which Claude Code does
    not know, so that CLAUDE_CODE_MAX_CONTEXT_TOKENS (read for unknown models only) gives
    the window it compacts by; the billing line, a per-session nonce that would defeat
    the prompt cache, is turned off (the server also drops it)."""
    window = {}
    if served.context >= CLAUDE_SMALLEST_WINDOW:
        window = {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(served.context)}
    else:
        print(
            f"mlxserve launch: a context of {served.context} tokens is too small for Claude "
            f"Code to compact in (it needs {CLAUDE_SMALLEST_WINDOW}); sessions end when it "
            "is full. `-- --bare` keeps its prompt to about 1,700 tokens.",
            file=sys.stderr,
        )
    env = {
        **window,
        "ANTHROPIC_BASE_URL": served.url,
        "ANTHROPIC_AUTH_TOKEN": served.api_key or "mlxserve",
        "ANTHROPIC_MODEL": served.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": served.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": served.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": served.model,
        "ANTHROPIC_SMALL_FAST_MODEL": served.model,
        "CLAUDE_CODE_SUBAGENT_MODEL": served.model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(output_tokens(served.context)),
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    return env, []


def codex_settings(served: Served) -> tuple[dict[str, str], list[str]]:
    """Codex's provider table (Responses API) and its context window, as `-c` overrides:
    nothing is written to ~/.codex. It compacts at 80% of the window."""
    provider = (
        f'{{name = "mlxserve", base_url = "{served.url}/v1", wire_api = "responses", '
        f'env_key = "{API_KEY_ENV}"}}'
    )
    overrides = {
        "model_provider": '"mlxserve"',
        "model_providers.mlxserve": provider,
        "model": json.dumps(served.model),
        "model_context_window": str(served.context),
        "model_auto_compact_token_limit": str(served.context * 4 // 5),
    }
    args = [part for key, value in overrides.items() for part in ("-c", f"{key}={value}")]
    return {API_KEY_ENV: served.api_key or "mlxserve"}, args


@dataclass(frozen=True)
class Agent:
    command: str  # the executable
    package: str  # where it comes from, for the message when it is missing
    settings: Callable[[Served], tuple[dict[str, str], list[str]]]
    server_flags: tuple[tuple[str, str], ...] = ()  # a server started for it, unless given


AGENTS = {
    "claude": Agent("claude", "npm install -g @anthropic-ai/claude-code", claude_settings),
    # Codex sends no max_output_tokens: the server's default is all its replies get.
    "codex": Agent(
        "codex", "npm install -g @openai/codex", codex_settings, (("--max-tokens", "8192"),)
    ),
}


def served_model(url: str, api_key: str, timeout: float = 3) -> Served | None:
    """The first model a server at `url` serves, or None when nothing answers there."""
    request = urllib.request.Request(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            models = json.loads(response.read())["data"]
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise SystemExit(f"mlxserve launch: {url} wants an API key: give --api-key") from e
        return None
    except (OSError, ValueError, KeyError):
        return None
    chat = [m for m in models if m.get("kind") != "embedding" and m.get("context_length")]
    if not chat:
        raise SystemExit(f"mlxserve launch: {url} serves no chat model with a known context")
    return Served(url, chat[0]["id"], chat[0]["context_length"], api_key)


def start_server(args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """`mlxserve ARGS --port 0`, its output in `log_path`; returns it and its URL."""
    command = [sys.executable, "-m", "mlxserve", *args]
    if "--port" not in args:
        command += ["--port", "0"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        log.flush()
        if "mlxserve is ready:" in line:
            url = line.split("ready:")[1].split()[0].removesuffix("/v1")
            threading.Thread(target=_copy, args=(process.stdout, log), daemon=True).start()
            return process, url
    raise SystemExit(f"mlxserve launch: the server did not start; see {log_path}")


def _copy(lines, log) -> None:
    """The server's later output into its log (a full pipe would stop it)."""
    for line in lines:
        log.write(line)
        log.flush()


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """(launcher options, server flags, agent arguments after `--`)."""
    agent_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, agent_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        prog="mlxserve launch",
        description="Run a coding agent against mlxserve: the server at --url, or one "
        "started with the other flags (as `mlxserve` takes them). Arguments after `--` "
        "go to the agent.",
    )
    p.add_argument("agent", choices=sorted(AGENTS))
    p.add_argument("--url", default=DEFAULT_URL, help=f"a running server (default {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV, ""))
    options, server_args = p.parse_known_args(argv)
    return options, server_args, agent_args


def main(argv: list[str]) -> int:
    options, server_args, agent_args = parse(argv)
    agent = AGENTS[options.agent]
    binary = shutil.which(agent.command)
    if binary is None:
        raise SystemExit(f"mlxserve launch: {agent.command} is not installed ({agent.package})")
    server = None
    served = None if server_args else served_model(options.url.rstrip("/"), options.api_key)
    if served is None:
        log_path = cache_root() / "launch" / f"{options.agent}-server.log"
        print(f"Starting mlxserve (log: {log_path})...", file=sys.stderr)
        defaults = (*agent.server_flags, ("--api-key", options.api_key))
        for flag, value in defaults:
            if value and flag not in server_args:
                server_args += [flag, value]
        server, url = start_server(server_args, log_path)
        served = served_model(url, options.api_key, timeout=START_SECONDS)
        if served is None:
            server.terminate()
            raise SystemExit(f"mlxserve launch: the server does not answer; see {log_path}")
    env, args = agent.settings(served)
    print(
        f"{agent.command} -> {served.url} ({served.model}, context {served.context} tokens)",
        file=sys.stderr,
    )
    try:
        return subprocess.call([binary, *args, *agent_args], env={**os.environ, **env})
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)

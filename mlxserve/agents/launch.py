"""`mlxserve launch CLIENT [SERVER FLAGS] [-- CLIENT ARGS]`: a coding agent (Claude Code,
Codex, OpenCode, Qwen Code, aider, Continue's cn) against mlxserve with everything set, in
one command; `mlxserve launch --list` shows them and which are installed.

It uses the server at --url when one answers there, else starts one (with the server
flags given, on a free port, its log in the cache folder) and stops it when the client
exits. From /v1/models it learns the model's name and context length, and runs the client
with its base URL and key, its model names, output limits that fit the context, and a
context window to compact by (each client's own settings, written once in AGENTS). What a
client reads from files is written to a temporary folder of the session's own, removed
when it exits: the user's configuration files are never written."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from websockets.exceptions import InvalidHandshake
from websockets.sync.client import connect

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
    websockets: bool = False  # it takes the Responses API over a WebSocket


def output_tokens(context: int) -> int:
    """The output limit an agent is given: an eighth of the context, at most 32,000 (the
    rest is for the conversation, which an agent compacts before it fills the window
    less this)."""
    return min(32000, context // 8)


# A client's environment and arguments, from the server it is given and a temporary folder
# of the session's own for what it reads from files.
Settings = tuple[dict[str, str], list[str]]


# Claude Code compacts when a conversation reaches its window less the output limit less
# 13,000 tokens, and refuses to send one within 3,000 tokens of the window: below this
# window it would refuse or compact every turn, so it is not told the window (it then
# takes its own default and runs until the server says the prompt is too long).
CLAUDE_SMALLEST_WINDOW = 24576


def claude_settings(served: Served, profile: Path) -> Settings:
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


def codex_settings(served: Served, profile: Path) -> Settings:
    """Codex's provider table (Responses API, over a WebSocket where the server takes one:
    each turn then sends only what is new) and its context window, as `-c` overrides:
    nothing is written to ~/.codex. It compacts at 80% of the window."""
    sockets = ", supports_websockets = true" if served.websockets else ""
    provider = (
        f'{{name = "mlxserve", base_url = "{served.url}/v1", wire_api = "responses", '
        f'env_key = "{API_KEY_ENV}"{sockets}}}'
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


def opencode_settings(served: Served, profile: Path) -> Settings:
    """OpenCode's provider for this server, in OPENCODE_CONFIG_CONTENT: OpenCode reads it
    after every configuration file (the user's, the project's), so it wins for the session
    and nothing is written to ~/.config/opencode. `limit.output` is the max_tokens it asks
    for, and it compacts when a conversation reaches `limit.context` less that."""
    limit = {"context": served.context, "output": output_tokens(served.context)}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "mlxserve",
        "options": {"baseURL": f"{served.url}/v1", "apiKey": served.api_key or "mlxserve"},
        "models": {served.model: {"name": served.model, "limit": limit}},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"mlxserve": provider},
        "model": f"mlxserve/{served.model}",
        "small_model": f"mlxserve/{served.model}",  # session titles
    }
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "OPENCODE_DISABLE_AUTOUPDATE": "1"}, []


def qwen_settings(served: Served, profile: Path) -> Settings:
    """Qwen Code's provider for this server, as the system settings file
    (QWEN_CODE_SYSTEM_SETTINGS_PATH names one of the session's own in place of
    /etc/qwen-code/settings.json): it overrides the user's and the project's settings, whose
    other choices still apply. Qwen Code assumes 200,000 tokens for a model it does not
    know: `contextWindowSize` is the window it compacts by, `max_tokens` the most it asks
    for. Usage statistics and auto-update are off, as for Claude Code."""
    generation = {
        "contextWindowSize": served.context,
        "samplingParams": {"max_tokens": output_tokens(served.context)},
    }
    provider = {
        "id": served.model,
        "name": served.model,
        "baseUrl": f"{served.url}/v1",
        "envKey": API_KEY_ENV,
        "generationConfig": generation,
    }
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": served.model},
        "modelProviders": {"openai": [provider]},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"enableAutoUpdate": False},
    }
    path = profile / "qwen-settings.json"
    path.write_text(json.dumps(settings, indent=2))
    env = {"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(path), API_KEY_ENV: served.api_key or "mlxserve"}
    return env, []


def aider_settings(served: Served, profile: Path) -> Settings:
    """aider through litellm's OpenAI provider (`openai/<model>`). litellm does not know the
    model: its context length goes in a model metadata file (aider sizes its repo map and
    chat history by it, and warns before sending a prompt that does not fit), and the output
    limit is sent as max_tokens with every request (aider sends none of its own, which
    leaves replies to the server's --max-tokens). Analytics (which --yes-always would agree
    to) and the update check are off for the session; the flags come first, so the user's
    own arguments override them."""
    name = f"openai/{served.model}"
    output = output_tokens(served.context)
    limits = {"max_input_tokens": served.context, "max_output_tokens": output, "max_tokens": output}
    free = {"input_cost_per_token": 0, "output_cost_per_token": 0}
    metadata = profile / "aider-model-metadata.json"
    metadata.write_text(
        json.dumps({name: {**limits, **free, "litellm_provider": "openai", "mode": "chat"}})
    )
    # "aider/extra_params" adds to every model's settings and keeps aider's own for the
    # model (its edit format); YAML, which JSON is.
    model_settings = profile / "aider-model-settings.yml"
    model_settings.write_text(
        json.dumps([{"name": "aider/extra_params", "extra_params": {"max_tokens": output}}])
    )
    args = ["--model", name, "--openai-api-base", f"{served.url}/v1"]
    args += ["--model-metadata-file", str(metadata), "--model-settings-file", str(model_settings)]
    args += ["--no-analytics", "--no-check-update"]
    return {"AIDER_OPENAI_API_KEY": served.api_key or "mlxserve"}, args


def cn_settings(served: Served, profile: Path) -> Settings:
    """Continue's cn with a config of the session's own (`--config`, which it takes in place
    of ~/.continue/config.yaml): the model at this server's URL, its `contextLength` (cn
    assumes 200,000 tokens otherwise, and compacts by it) and `maxTokens`. YAML, which JSON
    is."""
    model = {
        "name": served.model,
        "provider": "openai",
        "model": served.model,
        "apiBase": f"{served.url}/v1",
        "apiKey": served.api_key or "mlxserve",
        "defaultCompletionOptions": {
            "contextLength": served.context,
            "maxTokens": output_tokens(served.context),
        },
    }
    config = {"name": "mlxserve", "version": "1.0.0", "schema": "v1", "models": [model]}
    path = profile / "cn-config.yaml"
    path.write_text(json.dumps(config, indent=2))
    return {}, ["--config", str(path)]


@dataclass(frozen=True)
class Agent:
    command: str  # the executable
    package: str  # how to install it, for --list and the message when it is missing
    dialect: str  # the API it speaks to the server
    settings: Callable[[Served, Path], Settings]
    server_flags: tuple[tuple[str, str], ...] = ()  # a server started for it, unless given


# The dialect is each client's own where it has one; the others speak OpenAI's Chat
# Completions, the API their OpenAI-compatible providers are written and tested against
# (OpenCode's @ai-sdk/openai-compatible, Qwen Code's default, litellm's openai/ models,
# cn's openai provider), with tool calls and reasoning in the shape they read.
AGENTS = {
    "claude": Agent(
        "claude",
        "npm install -g @anthropic-ai/claude-code",
        "Anthropic Messages",
        claude_settings,
    ),
    # Codex sends no max_output_tokens: the server's default is all its replies get.
    "codex": Agent(
        "codex",
        "npm install -g @openai/codex",
        "OpenAI Responses",
        codex_settings,
        (("--max-tokens", "8192"),),
    ),
    "opencode": Agent(
        "opencode", "npm install -g opencode-ai", "OpenAI Chat Completions", opencode_settings
    ),
    "qwen": Agent(
        "qwen", "npm install -g @qwen-code/qwen-code", "OpenAI Chat Completions", qwen_settings
    ),
    "aider": Agent(
        "aider",
        "python -m pip install aider-install && aider-install",
        "OpenAI Chat Completions",
        aider_settings,
    ),
    "cn": Agent("cn", "npm install -g @continuedev/cli", "OpenAI Chat Completions", cn_settings),
}


def list_agents() -> None:
    """Each client, the API it speaks, whether it is on the PATH, and how to install it."""
    print("mlxserve launch CLIENT starts:")
    for name, agent in AGENTS.items():
        found = shutil.which(agent.command)
        state = f"installed ({found})" if found else f"not installed: {agent.package}"
        print(f"  {name:<9}{agent.dialect:<25}{state}")


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
    sockets = offers_websockets(url, api_key, timeout)
    return Served(url, chat[0]["id"], chat[0]["context_length"], api_key, sockets)


def offers_websockets(url: str, api_key: str, timeout: float) -> bool:
    """Whether the server takes the Responses API over a WebSocket (an older one answers
    the handshake with an HTTP error)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with connect(
            f"ws{url.removeprefix('http')}/v1/responses",
            additional_headers=headers,
            open_timeout=min(timeout, 10),
        ):
            return True
    except (OSError, InvalidHandshake):
        return False


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
    p.add_argument(
        "agent", nargs="?", choices=list(AGENTS), metavar="CLIENT", help=", ".join(AGENTS)
    )
    p.add_argument("--list", action="store_true", help="the clients, and which are installed")
    p.add_argument("--url", default=DEFAULT_URL, help=f"a running server (default {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV, ""))
    options, server_args = p.parse_known_args(argv)
    if options.agent is None and not options.list:
        p.error(f"name a client ({', '.join(AGENTS)}), or --list")
    return options, server_args, agent_args


def main(argv: list[str]) -> int:
    options, server_args, agent_args = parse(argv)
    if options.list:
        list_agents()
        return 0
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
    print(
        f"{agent.command} -> {served.url} ({served.model}, context {served.context} tokens)",
        file=sys.stderr,
    )
    try:
        with tempfile.TemporaryDirectory(prefix=f"mlxserve-launch-{options.agent}-") as profile:
            env, args = agent.settings(served, Path(profile))
            return subprocess.call([binary, *args, *agent_args], env={**os.environ, **env})
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)

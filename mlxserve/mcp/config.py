"""`--mcp-config`: the MCP servers the operator runs tools from, in the file format MCP
clients already share (Claude Desktop's, Cursor's, VS Code's `mcpServers`):

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."],
                  "env": {"DEBUG": "0"}},
        "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "Bearer x"}}
    }}

A server with a `command` runs as a child process spoken to over stdio; one with a `url`
over streamable HTTP. Only this file names commands: a request never does."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

STDIO, HTTP = "stdio", "http"


class McpConfigError(ValueError):
    """The file cannot be read as MCP servers; the message names the place."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str | None = None  # stdio: the program, its arguments, its extra environment
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None  # streamable HTTP: the endpoint and the headers it is sent
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return STDIO if self.command is not None else HTTP

    @property
    def target(self) -> str:
        """What the server is, as the status page shows it (no header values)."""
        if self.command is None:
            return str(self.url)
        return " ".join([self.command, *self.args])


def load(path: Path) -> tuple[McpServerConfig, ...]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise McpConfigError(f"--mcp-config {path}: {e}") from e
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f'--mcp-config {path}: expected {{"mcpServers": {{name: server}}}}')
    return tuple(_server(str(name), entry, path) for name, entry in servers.items())


def _server(name: str, entry, path: Path) -> McpServerConfig:
    where = f"--mcp-config {path}: mcpServers.{name}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected an object")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f"{where}: give either `command` (stdio) or `url` (HTTP)")
    args, env, headers = entry.get("args", []), entry.get("env", {}), entry.get("headers", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args: expected a list of strings")
    for label, mapping in (("env", env), ("headers", headers)):
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise McpConfigError(f"{where}.{label}: expected an object of strings")
    for label, value in (("command", command), ("url", url), ("cwd", entry.get("cwd"))):
        if value is not None and not isinstance(value, str):
            raise McpConfigError(f"{where}.{label}: expected a string")
    if url is not None and not url.startswith(("http://", "https://")):
        raise McpConfigError(f"{where}.url: expected an http:// or https:// URL")
    return McpServerConfig(
        name, command, tuple(args), dict(env), entry.get("cwd"), url, dict(headers)
    )


def checked(text: str) -> Path:
    """--mcp-config's value: a file that reads as MCP servers (read again at start-up)."""
    path = Path(text)
    try:
        load(path)
    except McpConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return path

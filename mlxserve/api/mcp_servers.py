"""What every dialect's MCP tools share at the edge: the tools a request offers the model
and the connections it opened for them, which URL a request may make the server connect
to (--mcp-allow-url, never a link-local or metadata address), OpenAI's 424 for a server
whose tools cannot be listed, and calls metered against the request's key."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from mlxserve.chat.fetch import refusal
from mlxserve.mcp.hub import McpConnectFailed, McpHub
from mlxserve.mcp.tools import CallOutcome, McpTool
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import ServiceError, bad_request, dependency_failed
from mlxserve.service.context import RequestContext
from mlxserve.telemetry.record import Metered


@dataclass(frozen=True)
class McpFunction:
    """An MCP tool as the model is offered it."""

    label: str  # its server as the request names it (server_label, server_name)
    server: str  # the hub's name for the connection
    tool: McpTool


@dataclass
class OfferedTools:
    """A request's MCP tools by name, and the connections it opened (closed with it)."""

    hub: McpHub
    context: RequestContext  # the request's: its calls are charged to its key
    functions: dict[str, McpFunction] = field(default_factory=dict)
    opened: list[str] = field(default_factory=list)

    def offer(self, function: McpFunction, taken: set[str], param: str, remedy: str) -> None:
        """Offer a tool, unless another offered tool or a client's (`taken`) has its name."""
        name = function.tool.name
        if name in self.functions or name in taken:
            raise bad_request(
                f"Two tools are named '{name}' (one of MCP server '{function.label}'); {remedy}.",
                param,
            )
        self.functions[name] = function

    def tools(self) -> tuple[neutral.Tool, ...]:
        return tuple(
            neutral.Tool(name, f.tool.description, f.tool.input_schema)
            for name, f in self.functions.items()
        )

    def labels(self) -> dict[str, str]:
        """Each tool's name -> its server's name as the request gave it."""
        return {name: f.label for name, f in self.functions.items()}

    def call(self, name: str, arguments: dict) -> CallOutcome:
        """A call to an offered tool, counted against the request's key (mcp_calls,
        mcp_seconds)."""
        function = self.functions[name]
        outcome = self.hub.call(function.server, function.tool.name, arguments)
        self.context.meter(Metered(mcp_calls=1, mcp_seconds=outcome.seconds))
        return outcome

    def close(self) -> None:
        for name in self.opened:
            self.hub.close(name)


def open_url(
    hub: McpHub, url: str, headers: dict[str, str], label: str, allow: tuple[str, ...], param: str
) -> str:
    """The hub's name for a connection to a request's server URL (the caller closes it)."""
    check_url(url, allow, param)
    try:
        return hub.open(url, headers)
    except McpConnectFailed as e:
        raise unavailable(label, str(e), param) from None


def check_url(url: str, allow: tuple[str, ...], param: str) -> None:
    """A request's server URL must match an --mcp-allow-url glob, and no address its host
    resolves to may be link-local or a cloud metadata service's."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad_request("The MCP server's URL must be an http:// or https:// URL.", param)
    if not any(fnmatchcase(url, pattern) for pattern in allow):
        raise bad_request(
            f"MCP server URL {url} is not allowed: it matches none of the server's "
            "--mcp-allow-url patterns" + ("" if allow else " (none are set)") + ".",
            param,
        )
    try:
        found = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise bad_request(f"The MCP server URL's host does not resolve ({e}).", param) from None
    for info in found:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        why = refusal(address, allow_local=True)
        if why is not None:
            raise bad_request(f"The MCP server URL's host is {address}, {why}.", param)


def unavailable(label: str, why: str, param: str) -> ServiceError:
    """OpenAI's 424 for an MCP server whose tools could not be listed."""
    return dependency_failed(
        f"Error retrieving tool list from MCP server '{label}': {why}",
        param,
        "mcp_server_unavailable",
    )

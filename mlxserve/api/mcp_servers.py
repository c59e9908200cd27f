"""What every dialect's MCP tools share at the edge: which URL a request may make the
server connect to (--mcp-allow-url, never a link-local or metadata address), opening it,
OpenAI's 424 for a server whose tools cannot be listed, and a call metered against the
request's key."""

from __future__ import annotations

import ipaddress
import socket
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from mlxserve.chat.fetch import refusal
from mlxserve.mcp.hub import McpConnectFailed, McpHub
from mlxserve.mcp.tools import CallOutcome
from mlxserve.protocol.errors import ServiceError, bad_request, dependency_failed
from mlxserve.telemetry.record import Metered, current_request


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


def metered_call(hub: McpHub, server: str, tool: str, arguments: dict) -> CallOutcome:
    """A call, counted against the request's key (mcp_calls, mcp_seconds)."""
    outcome = hub.call(server, tool, arguments)
    record = current_request()
    if record is not None:
        record.meter(Metered(mcp_calls=1, mcp_seconds=outcome.seconds))
    return outcome

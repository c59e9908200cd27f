"""Anthropic's MCP connector: a Messages request's `mcp_servers` (each a URL the server
connects to for the request, where --mcp-allow-url allows it), their tools offered to the
model as the server's tool configuration or an `mcp_toolset` says, and the model's calls
to them run here: `mcp_tool_use` and `mcp_tool_result` blocks in the assistant's message.
endpoints.py runs the rounds."""

from __future__ import annotations

import json
from dataclasses import dataclass

from mlxserve.api.anthropic.requests import (
    McpServerDefinition,
    McpToolset,
    MessagesRequest,
    Tool,
)
from mlxserve.api.mcp_servers import McpFunction, OfferedTools, open_url, unavailable
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol.errors import bad_request
from mlxserve.service.context import RequestContext


@dataclass
class McpConnector(OfferedTools):
    """The request's MCP servers' tools (labels: the server_name their mcp_tool_use
    blocks carry)."""

    def run(self, use: dict) -> dict:
        """Run an mcp_tool_use block's call: its mcp_tool_result block."""
        outcome = self.call(use["name"], use["input"])
        if outcome.error is None:
            text, failed = outcome.output or "", False
        else:
            error = outcome.error
            text = error.get("message") or json.dumps(error.get("content", error))
            failed = True
        return {
            "type": "mcp_tool_result",
            "tool_use_id": use["id"],
            "is_error": failed,
            "content": [{"type": "text", "text": text}],
        }


def connector(
    wire: MessagesRequest, hub: McpHub, allow: tuple[str, ...], context: RequestContext
) -> McpConnector | None:
    """The request's MCP servers, connected and listed (the caller closes them); None
    without any."""
    servers = wire.mcp_servers or []
    toolsets = {t.mcp_server_name: (i, t) for i, t in _toolsets(wire)}
    for name, (i, _) in toolsets.items():
        if name not in {server.name for server in servers}:
            raise bad_request(
                f"The mcp_toolset names '{name}', which is not among mcp_servers.",
                f"tools[{i}].mcp_server_name",
            )
    if not servers:
        return None
    taken = {tool.name for tool in wire.tools or [] if isinstance(tool, Tool)}
    mcp = McpConnector(hub, context)
    try:
        for i, server in enumerate(servers):
            _add(mcp, server, f"mcp_servers[{i}]", toolsets.get(server.name), taken, allow)
    except BaseException:
        mcp.close()
        raise
    return mcp


def _add(
    mcp: McpConnector,
    server: McpServerDefinition,
    param: str,
    toolset: tuple[int, McpToolset] | None,
    taken: set[str],
    allow: tuple[str, ...],
) -> None:
    headers = {}
    if server.authorization_token is not None:
        headers["Authorization"] = f"Bearer {server.authorization_token}"
    name = open_url(mcp.hub, server.url, headers, server.name, allow, f"{param}.url")
    mcp.opened.append(name)
    tools = mcp.hub.tools(name)
    if tools is None:
        raise unavailable(server.name, mcp.hub.error(name) or "not connected", f"{param}.url")
    for tool in tools:
        if not _offered(tool.name, server, toolset[1] if toolset else None):
            continue
        remedy = "leave one out with tool_configuration.allowed_tools"
        mcp.offer(
            McpFunction(server.name, name, tool), taken, f"{param}.tool_configuration", remedy
        )


def _offered(tool: str, server: McpServerDefinition, toolset: McpToolset | None) -> bool:
    """As the connector's 2025-04-04 tool_configuration and 2025-11-20 mcp_toolset say
    (both where a request gives both); every tool where neither does."""
    if toolset is not None and not toolset.enabled(tool):
        return False
    config = server.tool_configuration
    if config is None:
        return True
    return config.enabled and (config.allowed_tools is None or tool in config.allowed_tools)


def _toolsets(wire: MessagesRequest) -> list[tuple[int, McpToolset]]:
    return [(i, t) for i, t in enumerate(wire.tools or []) if isinstance(t, McpToolset)]

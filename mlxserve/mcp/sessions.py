"""The `mcp` SDK's side of a connection: a client for a configured server, its tool list,
a ping. Imported when the first connection is made (the SDK takes most of a second to
import, which a server without MCP servers never pays)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError
from mcp.shared.exceptions import MCPError

from mlxserve.mcp.config import McpServerConfig
from mlxserve.mcp.tools import CONNECTION_CLOSED, McpTool

log = logging.getLogger(__name__)


def connected(config: McpServerConfig, on_message: Callable) -> Client:
    """A client (an async context manager) for the server `config` names."""
    return Client(_target(config), message_handler=on_message)


async def tool_changes(client: Client, changed: Callable[[], None], name: str) -> None:
    """Call `changed` each time the server's tool list changes: a `subscriptions/listen`
    stream where the server speaks MCP's 2026 revision (its notifications come only so);
    an older server's notifications come to the message handler instead."""
    try:
        async with client.listen(tools_list_changed=True) as changes:
            async for _ in changes:
                changed()
    except ListenNotSupportedError:
        return
    except Exception as e:  # the server does not offer it: the list stays as listed
        log.info("MCP server %r does not tell when its tools change (%s)", name, e)


async def ping(client: Client, seconds: float) -> None:
    """Raises where the server does not answer in time. Any answer will do: a server of
    MCP's 2026 revision answers a ping with "method not found", and is alive."""
    try:
        with anyio.fail_after(seconds):
            await client.send_ping()
    except Exception as e:
        if answer(e) is None:
            raise


def answer(error: Exception):
    """The JSON-RPC error a server answered with, or None (no answer: the connection
    closed, the transport failed)."""
    if isinstance(error, MCPError) and error.error.code != CONNECTION_CLOSED:
        return error.error
    return None


def _target(config: McpServerConfig):
    if config.command is not None:
        return StdioServerParameters(
            command=config.command, args=list(config.args), env=config.env or None, cwd=config.cwd
        )
    assert config.url is not None
    return _http(config.url, config.headers)


@asynccontextmanager
async def _http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with the configured headers (the SDK's timeouts: a reply stream may
    stay open for minutes)."""
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


async def listed(client: Client) -> tuple[McpTool, ...]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(
        McpTool(
            tool.name,
            tool.description,
            tool.input_schema,
            tool.annotations.model_dump(exclude_none=True) if tool.annotations else None,
        )
        for tool in tools
    )

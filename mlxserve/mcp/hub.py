"""The MCP servers of `--mcp-config`, connected with the official `mcp` SDK's client on a
thread of their own (an asyncio loop), so a slow or hung server never holds up the
generation thread or another request: HTTP handler threads wait on their own call only,
for at most `--mcp-call-timeout`.

Each server is supervised: connected at start-up, its tools listed (and listed again on
its `tools/list_changed` notification), pinged while idle; a server that dies or stops
answering is connected again (a stdio server restarted) after 1, 2, 4... up to 30 seconds.
Meanwhile its calls fail at once with an error that says so, which the model sees."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import secrets
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from mlxserve.mcp.config import McpServerConfig
from mlxserve.mcp.tools import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallOutcome,
    McpTool,
    protocol_error,
)

if TYPE_CHECKING:
    from mcp import Client

log = logging.getLogger(__name__)

FIRST_RETRY, LAST_RETRY = 1.0, 30.0  # seconds before connecting again, doubling
PING_SECONDS = 5.0  # an idle connection is pinged this often; a ping unanswered breaks it
TOOLS_CHANGED = "notifications/tools/list_changed"


class McpUnknownServer(KeyError):
    """No server of that name in --mcp-config."""


class McpConnectFailed(Exception):
    """A server a request named could not be connected or listed; the message says why."""


@dataclass
class _Connection:
    config: McpServerConfig
    state: str = "starting"  # starting, ready, restarting; a request's own: failed
    tools: tuple[McpTool, ...] = ()
    error: str | None = None  # why it last failed
    restarts: int = 0
    client: Client | None = None
    for_request: bool = False  # opened for one request's server URL (not configured)
    broken: asyncio.Event = field(default_factory=asyncio.Event)  # set where a call failed
    stale: asyncio.Event = field(default_factory=asyncio.Event)  # set on list_changed


class McpHub:
    def __init__(self, servers: tuple[McpServerConfig, ...], call_timeout: float, max_output: int):
        self.call_timeout = call_timeout
        self.max_output = max_output
        self._connections = {server.name: _Connection(server) for server in servers}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task] = []
        self._opened: dict[str, asyncio.Task] = {}  # connections a request opened, by name
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        """The configured servers (not those a request opened)."""
        return tuple(n for n, conn in self._connections.items() if not conn.for_request)

    def start(self, wait: float = 30.0) -> None:
        """Connect every server; wait up to `wait` seconds for their first tool lists (a
        server not ready by then goes on connecting in the background)."""
        if not self._connections:
            return
        self._ensure_loop()
        self._run(self._supervise_all()).result()
        ready = self._run(self._first_lists())
        try:
            ready.result(wait)
        except concurrent.futures.TimeoutError:
            ready.cancel()
        for conn in self._connections.values():
            if conn.state != "ready":
                log.warning("MCP server %r is not ready: %s", conn.config.name, conn.error)

    def _ensure_loop(self) -> None:
        with self._lock:
            if self._loop is not None:
                return
            loop = self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="mcp", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Disconnect (stdio servers end with their pipes)."""
        loop = self._loop
        if loop is None:
            return
        try:
            self._run(self._cancel_all()).result(10)
        except concurrent.futures.TimeoutError:
            log.warning("MCP servers did not close within 10 s")
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def open(self, url: str, headers: dict[str, str]) -> str:
        """Connect to a server a request names by URL, for that request (no restarts);
        its name for `tools`, `call` and `close`. McpConnectFailed where it cannot be
        connected and listed within the call timeout."""
        self._ensure_loop()
        name = f"request:{secrets.token_hex(8)}"
        conn = _Connection(McpServerConfig(name, url=url, headers=headers), for_request=True)
        self._connections[name] = conn
        future = self._run(self._open(name, conn))
        try:
            future.result(self.call_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            conn.error = f"no tool list within {self.call_timeout:g} s"
        if conn.state != "ready":
            self.close(name)
            raise McpConnectFailed(conn.error or "not connected")
        return name

    def close(self, name: str) -> None:
        """End a connection `open` made."""
        task = self._opened.pop(name, None)
        self._connections.pop(name, None)
        if task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(task.cancel)

    def states(self) -> list[dict]:
        """Each server as `GET /v1/mcp/servers` and the status page show it."""
        return [
            {
                "name": conn.config.name,
                "transport": conn.config.transport,
                "target": conn.config.target,
                "state": conn.state,
                "tools": [tool.name for tool in conn.tools],
                "error": conn.error,
                "restarts": conn.restarts,
            }
            for conn in list(self._connections.values())
            if not conn.for_request
        ]

    def tools(self, server: str) -> tuple[McpTool, ...] | None:
        """The server's tools as last listed; None while it is not connected."""
        conn = self._connection(server)
        return conn.tools if conn.state == "ready" else None

    def error(self, server: str) -> str | None:
        return self._connection(server).error

    def call(self, server: str, tool: str, arguments: dict) -> CallOutcome:
        """Call a tool and wait (on the caller's thread) for its outcome; any failure,
        a timeout included, is an outcome with an error, never an exception."""
        conn = self._connection(server)
        if self._loop is None:
            return protocol_error(CONNECTION_CLOSED, f"MCP server '{server}' is not started")
        started = self._loop.time()
        future = self._run(self._call(conn, tool, arguments))
        try:
            outcome = future.result(self.call_timeout + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            outcome = _timed_out(tool, self.call_timeout)
        return CallOutcome(outcome.output, outcome.error, self._loop.time() - started)

    # The loop's side ----------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _connection(self, server: str) -> _Connection:
        if server not in self._connections:
            raise McpUnknownServer(server)
        return self._connections[server]

    async def _supervise_all(self) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._supervise(conn), name=name)
            for name, conn in self._connections.items()
        ]

    async def _open(self, name: str, conn: _Connection) -> None:
        """Start a request's connection; returns once it is ready or has failed."""
        task = asyncio.get_running_loop().create_task(self._hold(conn), name=name)
        self._opened[name] = task
        while conn.state == "starting" and not task.done():
            await asyncio.sleep(0.02)

    async def _hold(self, conn: _Connection) -> None:
        """A request's connection, held until it is closed (cancelled) or fails."""
        await self._session(conn)
        conn.state = "failed"

    async def _first_lists(self) -> None:
        while any(c.state == "starting" for c in self._connections.values()):
            await asyncio.sleep(0.05)

    async def _cancel_all(self) -> None:
        tasks = [*self._tasks, *self._opened.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise(self, conn: _Connection) -> None:
        """A configured server's connection, made again (a stdio server restarted) each
        time it ends, after a back-off."""
        delay = FIRST_RETRY
        while True:
            conn.broken.clear()
            if await self._session(conn):
                delay = FIRST_RETRY
            conn.state = "restarting"
            conn.restarts += 1
            log.warning(
                "MCP server %r failed (%s); connecting again in %.0f s",
                conn.config.name,
                conn.error,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, LAST_RETRY)

    async def _session(self, conn: _Connection) -> bool:
        """One connection, from connecting until it breaks (why: `conn.error`); whether
        it got as far as its tool list."""
        from mlxserve.mcp import sessions  # the SDK, on first use

        listed = False
        try:
            async with sessions.connected(conn.config, _watcher(conn)) as client:
                conn.tools = await sessions.listed(client)
                conn.client, conn.state, conn.error = client, "ready", None
                listed = True
                log.info("MCP server %r: %d tools", conn.config.name, len(conn.tools))
                await self._serve(conn, client)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a dead transport ends in an exception group
            conn.error = _describe(e)
        conn.client = None
        return listed

    async def _serve(self, conn: _Connection, client: Client) -> None:
        """Until the connection breaks: list the tools again when they change, ping while
        idle."""
        from mlxserve.mcp import sessions  # the SDK, on first use

        changes = asyncio.get_running_loop().create_task(
            sessions.tool_changes(client, conn.stale.set, conn.config.name)
        )
        try:
            while not conn.broken.is_set():
                try:
                    await asyncio.wait_for(conn.stale.wait(), PING_SECONDS)
                except TimeoutError:
                    await sessions.ping(client, PING_SECONDS)
                    continue
                conn.stale.clear()
                conn.tools = await sessions.listed(client)
                log.info("MCP server %r: tools changed, %d now", conn.config.name, len(conn.tools))
        finally:
            changes.cancel()
        raise ConnectionError(conn.error or "a call failed")

    async def _call(self, conn: _Connection, tool: str, arguments: dict) -> CallOutcome:
        from mlxserve.mcp import sessions  # the SDK, on first use

        client = conn.client
        if client is None:
            why = f": {conn.error}" if conn.error else ""
            return protocol_error(
                CONNECTION_CLOSED, f"MCP server '{conn.config.name}' is not connected{why}"
            )
        try:
            with anyio.fail_after(self.call_timeout):
                result = await client.call_tool(tool, arguments)
        except TimeoutError:
            return _timed_out(tool, self.call_timeout)
        except Exception as e:
            if (answer := sessions.answer(e)) is not None:  # an error the server answered
                return protocol_error(answer.code, answer.message)
            conn.error = _describe(e)
            conn.broken.set()
            return protocol_error(
                CONNECTION_CLOSED, f"MCP server '{conn.config.name}': {conn.error}"
            )
        content = [part.model_dump(mode="json", exclude_none=True) for part in result.content]
        if result.is_error:
            return CallOutcome(error={"type": "mcp_tool_execution_error", "content": content})
        return CallOutcome(output=_limited(_text(content), self.max_output))


def _watcher(conn: _Connection):
    async def on_message(message) -> None:
        if getattr(message, "method", None) == TOOLS_CHANGED:
            conn.stale.set()

    return on_message


def _text(content: list[dict]) -> str:
    """The call's content as the model reads it: text parts as they are, others as JSON."""
    return "\n".join(
        part["text"] if part.get("type") == "text" else json.dumps(part) for part in content
    )


def _limited(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut by the server]"


def _timed_out(tool: str, seconds: float) -> CallOutcome:
    return protocol_error(REQUEST_TIMEOUT, f"The call to '{tool}' timed out after {seconds:g} s.")


def _describe(error: BaseException) -> str:
    """The innermost cause of a failure, in a line."""
    while getattr(error, "exceptions", None):  # an exception group: its first
        error = error.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__

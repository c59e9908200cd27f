"""An MCP server written with the official `mcp` SDK (MCPServer), run by the tests over
stdio (`python mcp_tools.py`) or streamable HTTP (`python mcp_tools.py http PORT`):
tiny-tool-agent's shell tool, which reports what it would run, a tool that raises, and a
tool that sleeps as long as it is asked, one that tells the HTTP headers it came with, and one that adds a tool. MCP_TESTS_BASH=raise makes the shell tool raise,
MCP_TESTS_BASH=hang makes it hang."""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

SERVER = MCPServer("tests")
RAN = "ran: "  # what the shell tool's output starts with


@SERVER.tool(description="Run a shell command.")
def bash(command: str) -> str:
    behaviour = os.environ.get("MCP_TESTS_BASH")
    if behaviour == "raise":
        raise ValueError("the shell is broken")
    if behaviour == "hang":
        time.sleep(3600)
    return RAN + command


@SERVER.tool(description="A tool that always fails.")
def broken() -> str:
    raise ValueError("the tool broke")


@SERVER.tool(description="Wait a number of seconds.")
def wait(seconds: float) -> str:
    time.sleep(seconds)
    return f"waited {seconds} s"


@SERVER.tool(description="The HTTP headers this call came with (HTTP only).")
def headers(ctx: Context) -> str:
    request = ctx.request_context.request
    return json.dumps(dict(request.headers) if request is not None else {})


def grown() -> str:
    return "grown"


@SERVER.tool(description="Add a tool to this server's list, and say the list changed.")
async def grow(ctx: Context) -> str:
    SERVER.add_tool(grown, description="A tool added at runtime.")
    await ctx.notify_tools_changed()  # to subscriptions/listen streams (MCP 2026)
    return "grew"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        SERVER.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        SERVER.run()

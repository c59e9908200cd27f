"""An MCP server (the `mcp` SDK's low-level Server, over stdio) whose one tool is the
weather tool exactly as tiny-chat was trained on it (conversations.WEATHER_TOOL: MCPServer
would add titles to its schema, and the prompt would no longer be the trained one)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from conversations import WEATHER_TOOL

FUNCTION = WEATHER_TOOL["function"]


async def list_tools(context, params) -> types.ListToolsResult:
    tool = types.Tool(
        name=FUNCTION["name"],
        description=FUNCTION["description"],
        input_schema=FUNCTION["parameters"],
    )
    return types.ListToolsResult(tools=[tool])


async def call_tool(context, params) -> types.CallToolResult:
    city = (params.arguments or {}).get("city", "")
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"Sunny in {city}")])


SERVER = Server("weather", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await SERVER.run(read, write, SERVER.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)

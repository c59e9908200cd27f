"""What the MCP servers offer and give, as the rest of mlxserve sees it: a tool, a call's
outcome (its output, or an error in the shape OpenAI's `mcp_call` items carry)."""

from __future__ import annotations

from dataclasses import dataclass

# JSON-RPC error codes as MCP uses them (mcp_types names them alike): in call outcomes
INVALID_REQUEST, INVALID_PARAMS = -32600, -32602
CONNECTION_CLOSED, REQUEST_TIMEOUT = -32000, -32001


@dataclass(frozen=True)
class McpTool:
    """A tool as the server lists it."""

    name: str
    description: str | None
    input_schema: dict
    annotations: dict | None = None

    @property
    def read_only(self) -> bool:
        return bool((self.annotations or {}).get("readOnlyHint"))


@dataclass(frozen=True)
class CallOutcome:
    """What a call gave: its output as text, or an error in the shape OpenAI's `mcp_call`
    items carry (`mcp_tool_execution_error` with the tool's content, or
    `mcp_protocol_error` with a code and message)."""

    output: str | None = None
    error: dict | None = None
    seconds: float = 0.0


def protocol_error(code: int, message: str) -> CallOutcome:
    """An outcome with an error in the shape of OpenAI's `mcp_protocol_error`."""
    return CallOutcome(error={"type": "mcp_protocol_error", "code": code, "message": message})

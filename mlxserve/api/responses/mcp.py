"""The Responses API's `mcp` tools: tools of an MCP server the server runs itself. A tool
names a server of `--mcp-config` by its `server_label`; its tools (those `allowed_tools`
lets through) are offered to the model as functions; the model's calls to them run here
and their outputs go back into the prompt, until the model answers (endpoints.py runs the
rounds). The output holds an `mcp_list_tools` item per server and an `mcp_call` item per
call, as OpenAI's does."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from pydantic import TypeAdapter

from mlxserve.api.mcp_servers import McpFunction, OfferedTools, open_url, unavailable
from mlxserve.api.responses.conversation import (
    Conversation,
    InputItem,
    McpApprovalResponseItem,
)
from mlxserve.api.responses.output import new_id
from mlxserve.api.wire import Strict
from mlxserve.mcp.hub import McpHub
from mlxserve.mcp.tools import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallOutcome,
    McpTool,
    protocol_error,
)
from mlxserve.protocol import request as neutral
from mlxserve.protocol.errors import bad_request
from mlxserve.service.context import RequestContext


class ToolFilter(Strict):
    tool_names: list[str] | None = None
    read_only: bool | None = None

    def matches(self, tool: McpTool) -> bool:
        named = self.tool_names is None or tool.name in self.tool_names
        return named and (self.read_only is None or tool.read_only == self.read_only)


class ApprovalFilter(Strict):
    always: ToolFilter | None = None
    never: ToolFilter | None = None


class McpToolSpec(Strict):
    type: Literal["mcp"]
    server_label: str
    server_url: str | None = None
    connector_id: str | None = None
    tunnel_id: str | None = None
    allowed_tools: list[str] | ToolFilter | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None
    require_approval: Literal["always", "never"] | ApprovalFilter | None = None
    server_description: str | None = None


_ITEMS = TypeAdapter(list[InputItem])


@dataclass(frozen=True)
class McpRound:
    """What a round of a turn with MCP tools adds to the request: the tools, the output
    items of the rounds before (calls and their outputs, the reasoning and text around
    them), and whether the turn's `max_tool_calls` are spent (then the model answers)."""

    tools: tuple[neutral.Tool, ...]
    items: list[dict]
    exhausted: bool = False

    def messages(self) -> tuple[neutral.Message, ...]:
        items = _ITEMS.validate_python(self.items)
        return Conversation(own=frozenset(range(len(items)))).messages(items, None)


@dataclass
class McpTurn(OfferedTools):
    """The request's MCP tools (labels: the server_label their mcp_call items carry),
    those whose calls wait for approval, and the `mcp_list_tools` items that listed them."""

    approval: frozenset[str] = frozenset()
    listed: list[dict] = field(default_factory=list)

    def round(self, items: list[dict], exhausted: bool = False) -> McpRound:
        """A round after `items` (the output so far)."""
        return McpRound(self.tools(), items, exhausted)

    def approved(self, items: list, history: list[dict]) -> list[dict]:
        """The calls the input's approval responses approve (`items`: the input's items),
        to run: an mcp_call item each, with its approval_request_id."""
        requests = {
            item["id"]: item for item in history if item.get("type") == "mcp_approval_request"
        }
        ran: list[dict] = []
        for i, item in enumerate(items):
            if not isinstance(item, McpApprovalResponseItem):
                continue
            request = requests.get(item.approval_request_id)
            if request is None:
                raise bad_request(
                    f"No mcp_approval_request '{item.approval_request_id}' in the "
                    "conversation this response continues (previous_response_id).",
                    f"input[{i}].approval_request_id",
                )
            if request["name"] not in self.functions:
                raise bad_request(
                    f"The approved call is to '{request['name']}', which none of the "
                    "request's mcp tools offers; send the same tools as the turn before.",
                    f"input[{i}].approval_request_id",
                )
            if item.approve:
                call = {**request, "id": new_id("mcp"), "type": "mcp_call", "output": None}
                call |= {"error": None, "approval_request_id": request["id"]}
                ran.append(call)
        return ran

    def run(self, item: dict) -> dict:
        """Run an mcp_call item's call; the item with its output or error."""
        outcome = self._call(item["name"], item["arguments"])
        status = "failed" if outcome.error is not None else "completed"
        return {**item, "output": outcome.output, "error": outcome.error, "status": status}

    def _call(self, name: str, arguments: str) -> CallOutcome:
        """The call, where its arguments are a JSON object (the model wrote them)."""
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return protocol_error(INVALID_PARAMS, f"arguments: {e}")
        if not isinstance(parsed, dict):
            return protocol_error(INVALID_PARAMS, "arguments: expected a JSON object")
        return self.call(name, parsed)


def not_run(item: dict) -> dict:
    """A call past the turn's max_tool_calls: the model is told, the server calls nothing."""
    message = "Not called: the response's max_tool_calls are spent."
    error = protocol_error(INVALID_REQUEST, message).error
    return {**item, "output": None, "error": error, "status": "failed"}


def turn(
    specs: list[tuple[int, McpToolSpec]],
    hub: McpHub,
    history: list[dict],
    taken: set[str],
    allow: tuple[str, ...],
    context: RequestContext,
) -> McpTurn | None:
    """The MCP tools of a request (`specs`: each with its index in `tools`); a server's
    tools listed earlier in the conversation (`history`'s mcp_list_tools) are not listed
    again. `taken`: the names of the client's own functions, which an MCP tool may not
    shadow. `allow`: the globs a `server_url` must match. The caller closes the turn."""
    if not specs:
        return None
    earlier = {
        item["server_label"]: item
        for item in history
        if item.get("type") == "mcp_list_tools" and not item.get("error")
    }
    mcp = McpTurn(hub, context)
    approval: set[str] = set()
    try:
        for index, spec in specs:
            param = f"tools[{index}]"
            server = _server(spec, hub, allow, param, mcp.opened)
            if spec.server_label in earlier:
                tools = tuple(_tool(entry) for entry in earlier[spec.server_label]["tools"])
            else:
                tools = tuple(t for t in _listed(hub, server, spec, param) if _allowed(spec, t))
                mcp.listed.append(list_item(spec.server_label, tools))
            for tool in tools:
                if not _allowed(spec, tool):
                    continue
                function = McpFunction(spec.server_label, server, tool)
                remedy = "give allowed_tools to leave one out"
                mcp.offer(function, taken, f"{param}.allowed_tools", remedy)
                if _needs_approval(spec, tool):
                    approval.add(tool.name)
    except BaseException:
        mcp.close()
        raise
    mcp.approval = frozenset(approval)
    return mcp


def list_item(label: str, tools: tuple[McpTool, ...]) -> dict:
    return {
        "id": new_id("mcpl"),
        "type": "mcp_list_tools",
        "server_label": label,
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "annotations": tool.annotations,
            }
            for tool in tools
        ],
        "error": None,
    }


def _server(
    spec: McpToolSpec, hub: McpHub, allow: tuple[str, ...], param: str, opened: list[str]
) -> str:
    """The hub's name for the tool's server: the configured one its label names, or a
    connection to its server_url, opened for the request."""
    for name in ("connector_id", "tunnel_id"):
        if getattr(spec, name) is not None:
            raise bad_request(
                f"{name} is not served: give a server_url, or name a server of the "
                "server's --mcp-config by its server_label.",
                f"{param}.{name}",
            )
    url = spec.server_url
    if url is None:
        if spec.server_label not in hub.names:
            configured = ", ".join(hub.names) or "none"
            raise bad_request(
                f"No MCP server '{spec.server_label}' in this server's --mcp-config "
                f"(configured: {configured}), and no server_url.",
                f"{param}.server_label",
            )
        return spec.server_label
    headers = dict(spec.headers or {})
    if spec.authorization is not None:
        headers["Authorization"] = f"Bearer {spec.authorization}"
    name = open_url(hub, url, headers, spec.server_label, allow, f"{param}.server_url")
    opened.append(name)
    return name


def _listed(hub: McpHub, server: str, spec: McpToolSpec, param: str) -> tuple[McpTool, ...]:
    tools = hub.tools(server)
    if tools is None:
        where = f"{param}.server_url" if spec.server_url else f"{param}.server_label"
        raise unavailable(spec.server_label, hub.error(server) or "not connected", where)
    return tools


def _needs_approval(spec: McpToolSpec, tool: McpTool) -> bool:
    """As OpenAI decides: every call waits for approval unless `never` (or a `never`
    filter that matches the tool, and no `always` filter that does)."""
    rule = spec.require_approval
    if rule is None or isinstance(rule, str):
        return rule != "never"
    if rule.always is not None and rule.always.matches(tool):
        return True
    return rule.never is None or not rule.never.matches(tool)


def _allowed(spec: McpToolSpec, tool: McpTool) -> bool:
    allowed = spec.allowed_tools
    if allowed is None:
        return True
    if isinstance(allowed, list):
        return tool.name in allowed
    return allowed.matches(tool)


def _tool(entry: dict) -> McpTool:
    return McpTool(
        entry["name"], entry.get("description"), entry["input_schema"], entry.get("annotations")
    )

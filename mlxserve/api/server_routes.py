"""The server's own routes: the web app, its status, API keys and their usage, the MCP
servers, Prometheus metrics."""

from __future__ import annotations

from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON, TEXT
from mlxserve.api.responder import RawReply
from mlxserve.api.status import StatusEndpoint
from mlxserve.api.table import Call, Route, as_caller, plain
from mlxserve.api.usage import UsageEndpoints
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol.errors import not_found
from mlxserve.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from mlxserve.telemetry.metrics import Metrics
from mlxserve.webapp import CONTENT_TYPES, HEADERS, asset

PAGE = "index.html"


def web_file(name: str) -> RawReply:
    found = asset(name)
    if found is None:
        raise not_found(f"The web app has no file {name}.", code="file_not_found")
    return RawReply(found.content_type, found.data, headers=HEADERS)


def metrics(registry: Metrics, call: Call) -> RawReply:
    return RawReply(METRICS_CONTENT_TYPE, registry.render())


def mcp_servers(hub: McpHub, call: Call) -> dict:
    return {"object": "list", "data": hub.states()}


# The web app's files hold no data (its API calls do): no key needed.
PAGE_ROUTES: tuple[Route[None], ...] = (
    Route("GET", "/", lambda _, call: web_file(PAGE), "The web app", "server", {CONTENT_TYPES[".html"]: s.STRING}, ERRORS, keyless=True, head=True),
    Route("GET", "/app/{name:path}", lambda _, call: web_file(call.params["name"]), "A file of the web app", "server", {kind: s.STRING for kind in CONTENT_TYPES.values()}, ERRORS, keyless=True),
)  # fmt: skip

STATUS_ROUTES: tuple[Route[StatusEndpoint], ...] = (
    Route("GET", "/v1/status", as_caller(StatusEndpoint.status), "What the web app shows", "server", {JSON: s.STATUS}, ERRORS),
)  # fmt: skip

DAY = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
USAGE_ROUTES: tuple[Route[UsageEndpoints], ...] = (
    Route("GET", "/v1/usage", lambda e, call: e.usage(call.query, call.context.caller), "An API key's usage by day and model", "keys", {JSON: s.USAGE_LIST}, ERRORS, query={"start": DAY, "end": DAY, "key": s.STRING}),
    Route("GET", "/v1/keys", plain(UsageEndpoints.keys), "The API keys (never their secrets)", "admin", {JSON: s.KEY_LIST}, ERRORS, admin=True),
)  # fmt: skip

MCP_ROUTES: tuple[Route[McpHub], ...] = (
    Route("GET", "/v1/mcp/servers", mcp_servers, "The MCP servers of --mcp-config: state and tools", "admin", {JSON: s.MCP_SERVER_LIST}, ERRORS, admin=True),
)  # fmt: skip

METRICS_ROUTES: tuple[Route[Metrics], ...] = (
    Route("GET", "/metrics", metrics, "Prometheus metrics", "admin", {TEXT: s.STRING}, ERRORS, admin=True),
)  # fmt: skip

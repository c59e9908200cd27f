"""GET /v1/status: what the web app's Models and Status pages show, as one JSON object
(the Prometheus text at /metrics is awkward in a browser)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from mlxserve.api.batches.keeper import BatchKeeper
from mlxserve.api.batches.owners import scope
from mlxserve.api.guards import exposure_warning
from mlxserve.api.websocket import OpenSockets
from mlxserve.keys.caller import Caller
from mlxserve.keys.gate import KeyGate
from mlxserve.keys.store import day_of
from mlxserve.mcp.hub import McpHub
from mlxserve.protocol.errors import ServiceError
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.activity import Activity

RECENT_BATCHES = 20  # batches and files the status lists


@dataclass
class StatusEndpoint:
    service: ChatService
    activity: Activity
    batches: BatchKeeper
    keys: KeyGate
    sockets: OpenSockets
    mcp: McpHub

    def status(self, caller: Caller) -> dict:
        warning = exposure_warning(self.service.config.host, self.keys.required)
        load = self.service.models.load_now(caller)
        return {
            "object": "status",
            "warnings": [warning] if warning else [],
            "default_model": load.default_model,
            "requests": {"running": load.running, "waiting": load.waiting},
            "websockets": len(self.sockets),
            "tokens_per_second": self.activity.tokens_per_second(),
            "memory": load.memory,
            "models": load.models,
            "recent": [
                r for r in self.activity.recent() if caller.admin or r["key"] == caller.name
            ],
            "batches": self._batches(caller),
            "usage": self._usage_today(caller),
            "mcp_servers": self._mcp_servers(caller),
        }

    def _mcp_servers(self, caller: Caller) -> list[dict]:
        """The MCP servers and their tools; what runs them (commands, URLs) to admins only."""
        return [s if caller.admin else {**s, "target": None} for s in self.mcp.states()]

    def _usage_today(self, caller: Caller) -> list[dict]:
        """Today's usage by key and model: the caller's own, or every key's for an admin."""
        today = day_of(time.time())
        rows = self.keys.usage(None if caller.admin else caller.name, today, today)
        return [{"key": row.key, "model": row.model, **asdict(row.metered)} for row in rows]

    def _batches(self, caller: Caller) -> dict:
        """The latest batches (both APIs') with their progress, and the latest files."""
        try:
            store = self.batches.existing()
        except ServiceError as e:  # another server holds the store
            return {"error": e.message, "jobs": [], "files": []}
        if store is None:
            return {"error": None, "jobs": [], "files": []}
        jobs = [
            {
                "id": batch.id,
                "api": batch.dialect,
                "endpoint": batch.endpoint,
                "status": batch.status,
                "created_at": batch.created_at,
                "counts": asdict(batch.counts),
            }
            for batch in store.batches(None, RECENT_BATCHES, owner=scope())
        ]
        files = [
            asdict(record) for record in store.files(None, RECENT_BATCHES, None, False, scope())
        ]
        return {"error": None, "jobs": jobs, "files": files}

"""GET /v1/status: what the web app's Models and Status pages show, as one JSON object
(the Prometheus text at /metrics is awkward in a browser)."""

from __future__ import annotations

from dataclasses import dataclass

from mlxserve.api.guards import exposure_warning
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.activity import Activity


@dataclass
class StatusEndpoint:
    service: ChatService
    activity: Activity

    def status(self) -> dict:
        worker, provider = self.service.worker, self.service.provider
        in_memory = {m.spec: m.nbytes for m in provider.resident}
        models = [
            {**entry, "memory_bytes": in_memory.get(spec, 0)}
            for entry, spec in (
                (provider.model_entry(name, spec), spec) for name, spec in provider.listed().items()
            )
        ] + [provider.adapter_entry(adapter) for adapter in provider.adapters.all()]
        config = self.service.config
        warning = exposure_warning(config.host, bool(config.api_key))
        return {
            "object": "status",
            "warnings": [warning] if warning else [],
            "default_model": next(iter(provider.served)),
            "requests": {"running": worker.running, "waiting": worker.waiting},
            "tokens_per_second": self.activity.tokens_per_second(),
            "memory": {
                "budget_bytes": worker.memory_budget,
                "weights_bytes": provider.weight_bytes(),
                "kv_cache_bytes": worker.kv_bytes,
                "prompt_cache_bytes": worker.prompt_cache.nbytes,
            },
            "models": models,
            "recent": self.activity.recent(),
        }

"""What the server prints once it is ready: one short screen that says where it is, what
it serves and what to do next."""

from __future__ import annotations

import json

from mlxserve.service.chat import ChatService
from mlxserve.units import format_bytes

HELLO = {"messages": [{"role": "user", "content": "Hello!"}]}


def ready_screen(
    origin: str, service: ChatService, api_key: bool, warning: str | None = None
) -> str:
    """`origin`: http://host:port; `warning`: what the operator must know (an exposed
    server). The first line is what scripts wait for."""
    catalog, worker = service.catalog, service.worker
    names = list(catalog.served)
    in_memory = {m.spec: m.nbytes for m in worker.models.resident}
    lines = [
        f"mlxserve is ready: {origin}/v1  (models: {', '.join(names)})",
        "",
        f"  Web app   {origin}/",
        f"  API       {origin}/v1  (OpenAI Chat Completions and Responses, Anthropic Messages)",
    ]
    for i, (name, spec) in enumerate(catalog.served.items()):
        context = catalog.context_length(spec)
        parts = [spec.kind, f"{context:,} tokens of context" if context else "context unknown"]
        parts.append(f"{format_bytes(in_memory.get(spec, 0))} in memory")
        lines.append(f"  {'Models' if i == 0 else '':<9} {name}: {', '.join(parts)}")
    by_base: dict[str, list[str]] = {}
    for adapter in catalog.adapters.all():
        by_base.setdefault(adapter.base, []).append(adapter.name)
    for i, (base, names_on_base) in enumerate(by_base.items()):
        lines.append(f"  {'Adapters' if i == 0 else '':<9} {', '.join(names_on_base)} (on {base})")
    budget = worker.memory_budget
    lines.append(
        f"  Memory    budget {format_bytes(budget)}" if budget else "  Memory    no budget"
    )
    if warning is not None:
        lines.append(f"  Warning   {warning}")
    auth = ' -H "Authorization: Bearer $MLXSERVE_API_KEY"' if api_key else ""
    host_port = origin.removeprefix("http://")
    lines += [
        "",
        "  Next: open the web app in a browser, or",
        f"    curl {origin}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
        f"      -d '{json.dumps(HELLO)}'",
        f"    mlxserve launch claude --url http://{host_port}   (--list: the others)",
    ]
    return "\n".join(lines)

"""Serving adapters at runtime, as an operator asks (the admin endpoints, the web app):
load a new one (its folder read and fitted to its base before it is served, so a broken
or mismatched folder is a 400 and nothing is kept), free one's memory, stop serving one."""

from __future__ import annotations

from mlxserve.adapters.registry import DeclaredAdapter
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.provider import ModelProvider
from mlxserve.protocol.errors import ServiceError, not_found


def load_adapter(
    provider: ModelProvider, worker: GenerationWorker, name: str, path: str, model: str | None
) -> DeclaredAdapter:
    """Serve the folder `path` as the adapter `name` on `model`, resident now."""
    known = provider.adapters.get(name) is not None
    declared = provider.declare_adapter(name, path, model)
    spec = provider.served[declared.base]
    try:
        worker.call(lambda: worker.adapters.ready(spec, name))
    except ServiceError as e:
        if not known:
            provider.adapters.forget(name)
        if e.code == "adapter_invalid":  # its folder: the body's `path`
            raise ServiceError(e.kind, e.message, "path", e.code) from e
        raise
    return declared


def free_adapter(provider: ModelProvider, worker: GenerationWorker, name: str) -> None:
    """Set a served adapter's memory free (it is read again when next asked for); a 409
    while requests use it."""
    adapter = served_adapter(provider, name)
    spec = provider.served[adapter.base]
    worker.call(lambda: worker.adapters.unload(spec, name))


def remove_adapter(provider: ModelProvider, worker: GenerationWorker, name: str) -> None:
    """Stop serving an adapter (its memory set free); a 409 while requests use it."""
    adapter = served_adapter(provider, name)
    spec = provider.served[adapter.base]

    def remove() -> None:  # on the generation thread: no request is admitted meanwhile
        worker.adapters.unload(spec, name)
        provider.adapters.forget(name)

    worker.call(remove)


def served_adapter(provider: ModelProvider, name: str) -> DeclaredAdapter:
    adapter = provider.adapters.get(name)
    if adapter is None:
        raise not_found(f"No adapter '{name}' is served.", param="name", code="adapter_not_found")
    return adapter

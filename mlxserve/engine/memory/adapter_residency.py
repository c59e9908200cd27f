"""Which adapters are in their models' memory: read from their folders when a request or
an operator first asks for them, set free least recently used first when a model holds
--max-loaded-adapters of them or the memory budget needs the room (never one that rows
use, nor a pinned one). Generation thread only."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlxserve.adapters.folder import AdapterError, read_adapter
from mlxserve.adapters.layers import ModelAdapters, Resident
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.memory.residency import RETRY_AFTER_SECONDS, Residency
from mlxserve.engine.memory.resident_set import ResidentSet
from mlxserve.models.spec import ModelSpec
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request, not_found
from mlxserve.units import format_bytes

log = logging.getLogger(__name__)


class AdapterResidency:
    def __init__(
        self,
        models: ResidentSet,
        residency: Residency,
        budget: int | None,
        in_use: Callable[[str], bool],
    ):
        """`in_use`: whether requests under an adapter run or wait."""
        self._models = models
        self._residency = residency
        self._budget = budget
        self._in_use = in_use

    def ready(self, spec: ModelSpec, name: str) -> Resident:
        """The adapter `name` resident in `spec`'s model (which is loaded first if need
        be): a 404 if it is no longer served, a 400 if its folder cannot be served on this
        model, a 503 if no room can be made for it."""
        loaded = self._residency.resident(spec)
        adapters = _adapters(loaded)
        resident = adapters.get(name)
        if resident is not None:
            return resident
        declared = self._models.catalog.adapters.get(name)
        if declared is None:
            raise not_found(
                f"The adapter '{name}' is not served.", param="model", code="model_not_found"
            )
        try:
            weights = read_adapter(declared.path)
            self._make_room(loaded, adapters, weights.nbytes, name)
            resident = adapters.add(name, declared.path, weights)
        except AdapterError as e:
            raise bad_request(
                f"The adapter '{name}' cannot be served on {spec.path.name}: {e}.",
                param="model",
                code="adapter_invalid",
            ) from e
        loaded.nbytes += resident.nbytes
        log.info(
            "Loaded adapter %s (%s, %s) on %s",
            name,
            resident.kind,
            format_bytes(resident.nbytes),
            spec.path.name,
        )
        return resident

    def unload(self, spec: ModelSpec, name: str) -> None:
        """Set an adapter free now (an operator's unload): a 409 while requests use it."""
        if self._in_use(name):
            raise ServiceError(
                ErrorKind.CONFLICT,
                f"The adapter '{name}' has requests running or waiting; retry once they end.",
                param="name",
                code="adapter_busy",
            )
        loaded = next((m for m in self._models.resident if m.spec == spec), None)
        if loaded is not None and loaded.adapters is not None:
            self._free(loaded, loaded.adapters, name)

    def _make_room(
        self, loaded: LoadedModel, adapters: ModelAdapters, need: int, name: str
    ) -> None:
        """Free idle, unpinned adapters, least recently used first, until one more fits
        the model's count and the memory budget."""
        limit = self._models.catalog.config_for(loaded.spec).max_loaded_adapters

        def fits() -> bool:
            over_budget = (
                self._budget is not None and self._residency.weight_bytes() + need > self._budget
            )
            return len(adapters.resident) < limit and not over_budget

        for resident in adapters.resident:
            if fits():
                return
            if not self._in_use(resident.name) and not self._models.catalog.adapters.pinned(
                resident.name
            ):
                self._free(loaded, adapters, resident.name)
        if not fits():
            held = ", ".join(r.name for r in adapters.resident)
            raise ServiceError(
                ErrorKind.UNAVAILABLE,
                f"No room for the adapter '{name}' ({format_bytes(need)}) on "
                f"{loaded.spec.path.name}: its adapters in memory ({held}) are in use or "
                "pinned, and --max-loaded-adapters or the memory budget allows no more. "
                "Retry when they are idle.",
                param="model",
                code="insufficient_memory",
                retry_after=RETRY_AFTER_SECONDS,
            )

    def _free(self, loaded: LoadedModel, adapters: ModelAdapters, name: str) -> None:
        resident = adapters.remove(name)
        if resident is not None:
            loaded.nbytes -= resident.nbytes
            log.info("Set adapter %s free (%s)", name, format_bytes(resident.nbytes))


def _adapters(loaded: LoadedModel) -> ModelAdapters:
    if loaded.adapters is None:
        raise bad_request(
            f"{loaded.spec.path.name} does not take adapters: they are served on text "
            "models, batched.",
            param="model",
            code="adapter_invalid",
        )
    return loaded.adapters

"""ResidentSet: the models in memory, least recently used first, with what keeps each
there: pins (--pin, or an admin request since) and keep times (--idle-unload-seconds, or
a request's keep_alive). Which one to unload for memory or idleness is residency.py's
choice; this is the set it chooses from.

Read on any thread; changed on the generation thread (loads, unloads), except pins and
keep times, which requests set."""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections import OrderedDict

from mlxserve.engine.memory.loader import LoadedModel, ModelLoader
from mlxserve.models.catalog import ModelCatalog
from mlxserve.models.spec import ModelSpec

log = logging.getLogger(__name__)


class ResidentSet:
    def __init__(self, catalog: ModelCatalog, loader: ModelLoader):
        self.catalog = catalog
        self.loader = loader
        self._resident: OrderedDict[ModelSpec, LoadedModel] = OrderedDict()  # LRU first
        self._lock = threading.Lock()  # changed on one thread, read on all
        self._last_used: dict[ModelSpec, float] = {}
        self._pins: dict[ModelSpec, bool] = {}  # set by admin requests, over the config
        # Seconds each model stays resident once idle, as a request asked (Ollama's
        # keep_alive; math.inf: until unloaded), over --idle-unload-seconds
        self._keep: dict[ModelSpec, float] = {}

    @property
    def resident(self) -> list[LoadedModel]:
        """The models in memory, least recently used first."""
        with self._lock:
            return list(self._resident.values())

    def holds(self, spec: ModelSpec) -> bool:
        with self._lock:
            return spec in self._resident

    def weight_bytes(self) -> int:
        """The weights of every resident model."""
        return sum(m.nbytes for m in self.resident)

    def memory_by_model(self) -> list[tuple[str, int]]:
        """(name, weight bytes) of each model in memory."""
        return [(self.catalog.name(m.spec), m.nbytes) for m in self.resident]

    # What keeps a model in memory ----------------------------------------------------------

    def touch(self, spec: ModelSpec) -> None:
        """A model was just used: it is the last to be unloaded for memory or idleness."""
        with self._lock:
            if spec in self._resident:
                self._resident.move_to_end(spec)
                self._last_used[spec] = time.monotonic()

    def idle_for(self, spec: ModelSpec) -> float:
        return time.monotonic() - self._last_used.get(spec, time.monotonic())

    def pinned(self, spec: ModelSpec) -> bool:
        """Never unloaded for memory or idleness: --pin / a model's `pin`, unless an admin
        request (POST /v1/models/pin) said otherwise since."""
        if spec in self._pins:
            return self._pins[spec]
        catalog = self.catalog
        return bool(catalog.config_for(spec).pin) and spec in catalog.served.values()

    def pin(self, spec: ModelSpec, pinned: bool) -> None:
        self._pins[spec] = pinned

    def keep_for(self, spec: ModelSpec, seconds: float | None) -> None:
        """Keep `spec` resident this long once idle (math.inf: until unloaded; None:
        --idle-unload-seconds again), until another request says otherwise."""
        if seconds is None:
            self._keep.pop(spec, None)
        else:
            self._keep[spec] = seconds

    def keep_time(self, spec: ModelSpec) -> float | None:
        """How long `spec` stays resident once idle (None: until unloaded)."""
        seconds = self._keep.get(spec, self.catalog.config.idle_unload_seconds)
        return None if seconds is None or seconds == math.inf else seconds

    @property
    def keeps_any(self) -> bool:
        """Whether some model is unloaded once idle long enough (the loop then looks)."""
        return self.catalog.config.idle_unload_seconds is not None or any(
            seconds != math.inf for seconds in self._keep.values()
        )

    # Changes, on the generation thread -----------------------------------------------------

    def activate(self, spec: ModelSpec) -> LoadedModel:
        """The model `spec` in memory, loaded now if it is not resident (the caller made
        room for it); a failed load leaves the resident models as they were."""
        with self._lock:
            loaded = self._resident.get(spec)
        if loaded is not None:
            self.touch(spec)
            return loaded
        return self.install(self.loader.read(spec))

    def install(self, loaded: LoadedModel) -> LoadedModel:
        """Make a model `read` resident; if the same model became resident meanwhile (an
        admin load), that one stays and this copy is dropped."""
        with self._lock:
            loaded = self._resident.setdefault(loaded.spec, loaded)
        self.touch(loaded.spec)
        return loaded

    def unload(self, spec: ModelSpec) -> None:
        """Free a model's weights (and MLX's cached buffers)."""
        import mlx.core as mx

        with self._lock:
            if self._resident.pop(spec, None) is None:
                return
            self._last_used.pop(spec, None)
        gc.collect()
        mx.clear_cache()
        log.info("Unloaded %s", spec.path)

"""Which models are in memory, each generative one with its session: loading (on a thread
of its own where it can, see loading.py), making room under the memory budget (idle
models out, least recently used first), unloading on request or after idling. Generation
thread only, but for the snapshots the status endpoints read."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.loop.model_session import Session
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.engine.memory.loading import BackgroundLoads
from mlxserve.engine.memory.resident_set import ResidentSet
from mlxserve.engine.speculation.verify import SpeculationCounts
from mlxserve.models.spec import ModelSpec, stored_bytes
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request
from mlxserve.units import format_bytes

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1  # a 503's Retry-After (also admission.Capacity's)


class Residency:
    def __init__(
        self,
        models: ResidentSet,
        cache: PromptCache,
        budget: int | None,
        open_session: Callable[[LoadedModel], Session],
        waiting: Callable[[ModelSpec], bool],
        wake: Callable[[], None],
        in_background: bool,
        only: ModelSpec | None = None,
    ):
        """`budget`: bytes for weights and KV caches (None: unbounded); `open_session`: a
        session for a model just loaded; `waiting`: whether requests for a model wait to
        start; `wake`: wakes the loop when a load ends; `in_background`: loads run on
        their own thread (not where ranks run in lockstep: every rank loads at one step);
        `only`: the one model a distributed server may serve."""
        self._models = models
        self._cache = cache
        self._budget = budget
        self._open_session = open_session
        self._waiting = waiting
        self._only = only
        self._in_background = in_background
        self._loads = BackgroundLoads(models.loader.read, wake)
        self.sessions: dict[ModelSpec, Session] = {}

    def open_sessions(self) -> list[Session]:
        """Every open session (a snapshot: the status endpoints read it from any thread)."""
        return list(self.sessions.values())

    @property
    def loading(self) -> ModelSpec | None:
        """The model loading on its own thread, if any."""
        return self._loads.loading

    def check_served(self, spec: ModelSpec) -> None:
        """A model sharded across ranks is the only one its ranks serve: loading another
        (a hot swap, an embedding model) is a single-machine feature."""
        if self._only is not None and spec != self._only:
            raise bad_request(
                f"This server serves {self._models.catalog.name(self._only)} across "
                "several machines (distributed); it cannot load other models.",
                param="model",
                code="model_not_available",
            )

    def resident(self, spec: ModelSpec) -> LoadedModel:
        """The model in memory, loaded first (making room for it) if need be."""
        self.check_served(spec)
        if not self._models.holds(spec):
            self._make_room(spec)
        return self._models.activate(spec)

    def session(self, spec: ModelSpec) -> Session:
        """The model's session, loading the model first (here) if it is not resident."""
        session = self.sessions.get(spec)
        if session is not None:
            return session
        return self._opened(self.resident(spec))

    def session_when_loaded(self, spec: ModelSpec) -> Session | None:
        """The model's session; None while its weights load on their own thread (the load
        begins here, after room is made for it, when no other load runs)."""
        if not self._in_background:
            return self.session(spec)
        if spec in self.sessions or self._models.holds(spec):
            return self.session(spec)
        loaded = self._loads.take(spec)
        if loaded is not None:
            return self._opened(self._models.install(loaded))
        if self._loads.loading is None:
            self.check_served(spec)
            self._make_room(spec)
            self._loads.start(spec)
        return None

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` resident and ready to serve (its session open, if it has one)."""
        if spec.generative:
            self.session(spec)
        return self.resident(spec)

    def unload_on_request(self, spec: ModelSpec) -> None:
        """Unload a model now: a 409 while it has requests; a model served across several
        machines stays."""
        if self._only is not None:
            raise bad_request(
                "A model served across several machines (distributed) stays loaded.",
                param="model",
                code="model_pinned",
            )
        if self.busy(spec):
            raise ServiceError(
                ErrorKind.CONFLICT,
                f"{spec.path.name} has requests running or waiting; it is unloaded once idle.",
                param="model",
                code="model_busy",
            )
        self.unload(spec)

    def checkpoints(self, spec: ModelSpec) -> bool:
        """Whether the model's caches continue only from exact prefixes (known once it is
        loaded): then prompts leave checkpoints on the way (see ContinuousBatch)."""
        session = self.sessions.get(spec)
        return session is not None and session.checkpoints

    def speculation(self) -> list[tuple[ModelSpec, SpeculationCounts]]:
        """Each speculating session's draft counts (read from any thread: a snapshot)."""
        sessions = list(self.sessions.items())
        return [(spec, s.speculation) for spec, s in sessions if s.speculation is not None]

    def accounting(self, spec: ModelSpec) -> tuple[int, int, int]:
        """What the loop's byte decisions count for a loaded model: its weights, and its
        KV cache per token and fixed (generation thread only)."""
        session = self.sessions.get(spec)
        footprint = session.footprint if session is not None else None
        per_token, fixed = (footprint.per_token, footprint.fixed) if footprint else (0, 0)
        return self.resident(spec).nbytes, per_token, fixed

    def busy(self, spec: ModelSpec) -> bool:
        session = self.sessions.get(spec)
        return self._waiting(spec) or (session is not None and len(session) > 0)

    def unload(self, spec: ModelSpec) -> None:
        session = self.sessions.pop(spec, None)
        if session is not None:
            session.close()
        self._cache.forget(spec.key)
        self._models.unload(spec)

    def unload_idle(self) -> None:
        """Unload unpinned models unused for their keep time (ResidentSet.keep_time); a busy
        model counts as used now."""
        for loaded in self._models.resident:
            spec = loaded.spec
            limit = self._models.keep_time(spec)
            if self.busy(spec):
                self._models.touch(spec)
            elif limit is not None and self.expire(spec, limit):
                log.info("%s idle for %.0fs", spec.path.name, limit)

    def expire(self, spec: ModelSpec, after: float = 0.0) -> bool:
        """Unload `spec` if it is idle, unpinned, and unused for `after` seconds (a
        request's keep_alive of 0 ends with it); whether it was."""
        models = self._models
        if self._only is not None or self.busy(spec) or models.pinned(spec):
            return False
        if models.idle_for(spec) < after or not models.holds(spec):
            return False
        self.unload(spec)
        return True

    def weight_bytes(self) -> int:
        """The resident models' weights and those of the model loading."""
        return self._models.weight_bytes() + self._loads.reserved_bytes()

    def _opened(self, loaded: LoadedModel) -> Session:
        """A session for a model just made resident (unloaded again if none opens)."""
        try:
            if self._budget is not None and self._budget <= self.weight_bytes():
                raise self._too_large(loaded.spec.path.name, loaded.nbytes)
            session = self._open_session(loaded)
        except ServiceError:
            self._models.unload(loaded.spec)
            raise
        self.sessions[loaded.spec] = session
        return session

    def _too_large(self, name: str, weight_bytes: int) -> ServiceError:
        return bad_request(
            f"The memory budget ({format_bytes(self._budget or 0)}) does not hold the "
            f"weights of {name} ({format_bytes(weight_bytes)}); raise --memory-budget-gb, or "
            "serve a smaller or quantized model (`mlxserve pull REPO --quantize 4`)."
        )

    def _make_room(self, spec: ModelSpec) -> None:
        """Unload idle models, least recently used first, until `spec`'s weights fit the
        memory budget beside the others; a 503 saying what is resident if they cannot."""
        budget = self._budget
        if budget is None:
            return
        need = stored_bytes(spec)
        if need >= budget:
            raise self._too_large(spec.path.name, need)
        for loaded in self._models.resident:
            if self.weight_bytes() + need <= budget:
                return
            if not self.busy(loaded.spec) and not self._models.pinned(loaded.spec):
                self.unload(loaded.spec)
        if self.weight_bytes() + need > budget:
            resident = ", ".join(
                f"{self._models.catalog.name(m.spec)} ({format_bytes(m.nbytes)}"
                f"{', busy' if self.busy(m.spec) else ''}"
                f"{', pinned' if self._models.pinned(m.spec) else ''})"
                for m in self._models.resident
            )
            raise ServiceError(
                ErrorKind.UNAVAILABLE,
                f"{spec.path.name} ({format_bytes(need)}) does not fit the memory budget "
                f"({format_bytes(budget)}) beside the resident models: {resident}. Retry "
                "when they are idle, or unload one.",
                param="model",
                code="insufficient_memory",
                retry_after=RETRY_AFTER_SECONDS,
            )

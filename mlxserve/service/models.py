"""The models as the edge asks about them: which a request may name (and its key use),
their /v1/models entries, residency as a request or an operator asks for it (load,
unload, pin, keep_alive), adapters served and dropped at run time, and health. With
ChatService and Media, the edge's one door into the core: the generation thread is
reached from here, never from an endpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mlxserve.adapters.registry import DeclaredAdapter
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.keys.caller import Caller, model_refused
from mlxserve.models.capabilities import MEDIA
from mlxserve.models.catalog import ModelCatalog
from mlxserve.models.spec import ModelSpec, stored_bytes
from mlxserve.postprocess.output import chat_markup, reasoning_markers
from mlxserve.protocol.errors import ServiceError, bad_request, not_found, unavailable
from mlxserve.service.context import RequestContext


@dataclass(frozen=True)
class Load:
    """What the server holds now, as the status page shows it."""

    default_model: str
    running: int  # sequences decoding
    waiting: int  # accepted, not decoding yet
    memory: dict[str, int | None]  # budget, weights, KV cache, prompt cache (bytes)
    models: list[dict]  # the entries the caller may use, each with its memory


@dataclass
class ServedModels:
    catalog: ModelCatalog
    worker: GenerationWorker

    # What a request may name -------------------------------------------------------------

    def resolve(self, requested: str | None, context: RequestContext) -> ModelSpec:
        """The spec of the model a request names (404 if not servable, 403 if the
        caller's key may not use it), noted in the request's record."""
        if not self.worker.alive:
            raise unavailable("The generation thread is not running.")
        spec = self.catalog.resolve(requested)
        adapter = self.catalog.adapter(requested)
        base = self.catalog.name(spec)
        name = adapter.name if adapter is not None else base
        if not context.caller.allows(requested, name, base):
            raise model_refused(requested or name)
        if context.record is not None:
            context.record.model = name
        return spec

    def resolve_kind(
        self, requested: str | None, context: RequestContext, kind: str, refusal: str, code: str
    ) -> ModelSpec:
        """The spec of the model a request names, which must be of `kind`: else a 400
        that says what it is and `refusal` (what it does not do)."""
        spec = self.resolve(requested, context)
        if spec.kind != kind:
            name = requested or self.catalog.name(spec)
            raise bad_request(
                f"The model '{name}' is a {spec.kind} model; {refusal}.", "model", code
            )
        return spec

    def spec_of(self, name: str) -> ModelSpec:
        """The spec a name stands for, whoever asks (a 404 if none)."""
        return self.catalog.resolve(name)

    def knows(self, name: str) -> bool:
        """Whether the name is a model this server can serve (whoever asks)."""
        try:
            self.catalog.resolve(name)
        except ServiceError:
            return False
        return True

    @property
    def alias(self) -> str:
        """The name of the default model (the first --model, or its --alias)."""
        return self.catalog.alias

    def name(self, spec: ModelSpec) -> str:
        return self.catalog.name(spec)

    def served(self) -> dict[str, ModelSpec]:
        """The --model ones, by name."""
        return dict(self.catalog.served)

    def listed(self) -> dict[str, ModelSpec]:
        """Every model /v1/models lists, by name."""
        return self.catalog.listed()

    def first_of_kind(self, kind: str) -> str | None:
        """The first --model of a kind (what a request naming none of its kind gets)."""
        return next((name for name, spec in self.catalog.served.items() if spec.kind == kind), None)

    def tokenizer(self, spec: ModelSpec) -> Any:
        return self.catalog.tokenizer(spec)

    def context_length(self, spec: ModelSpec) -> int | None:
        return self.catalog.context_length(spec)

    def adapter(self, requested: str | None) -> DeclaredAdapter | None:
        """The served adapter a name stands for, if it stands for one."""
        return self.catalog.adapter(requested)

    def find_adapter(self, given: str) -> DeclaredAdapter | None:
        """A served adapter by its name or its folder."""
        adapters = self.catalog.adapters
        return adapters.get(given) or adapters.by_path(given)

    # The model list ------------------------------------------------------------------------

    def entries(self, caller: Caller) -> list[dict]:
        """Every servable model the caller may use (the --model ones first) with its
        capabilities, then the adapters (with their base's)."""
        catalog = self.catalog
        models = [
            {**self._model_entry(name, spec), "capabilities": self.capabilities(spec)}
            for name, spec in catalog.listed().items()
            if caller.allows(name)
        ]
        return models + [
            {
                **self._adapter_entry(adapter),
                "capabilities": self.capabilities(catalog.served[adapter.base]),
            }
            for adapter in catalog.adapters.all()
            if caller.allows(adapter.name, adapter.base)
        ]

    def entry(self, requested: str) -> dict:
        """The /v1/models entry of the model (or adapter) a request's name stands for."""
        adapter = self.catalog.adapter(requested)
        spec = self.catalog.resolve(requested)
        entry = self._adapter_entry(adapter) if adapter else self._model_entry(requested, spec)
        return {**entry, "capabilities": self.capabilities(spec)}

    def capabilities(self, spec: ModelSpec) -> dict:
        """`tools`: every generative model takes them (injected into the prompt where its
        template has none). `reasoning`: whether its replies carry reasoning, read from
        its tokenizer; null for a model whose tokenizer has not been loaded yet."""
        if not spec.generative:
            return {"tools": False, "reasoning": False}
        catalog = self.catalog
        served = spec in catalog.served.values()
        tokenizer = catalog.tokenizer(spec) if served else catalog.loaded_tokenizer(spec)
        if tokenizer is None:
            return {"tools": True, "reasoning": None}
        markup = chat_markup(
            tokenizer,
            reasoning_parser=catalog.config_for(spec).reasoning_parser,
            tool_parser=None,
            tools_in_request=None,
        )
        return {"tools": True, "reasoning": reasoning_markers(markup) is not None}

    def state(self, name: str) -> dict:
        """Whether a model (or an adapter) is resident now, and pinned."""
        adapter = self.catalog.adapter(name)
        if adapter is not None:
            entry = self._adapter_entry(adapter)
            return {
                "id": name,
                "object": "model",
                "state": entry["state"],
                "pinned": entry["pinned"],
            }
        spec = self.catalog.resolve(name)
        state = "loaded" if self.is_resident(spec) else "not-loaded"
        pinned = self.worker.models.pinned(spec)
        return {"id": name, "object": "model", "state": state, "pinned": pinned}

    def load_now(self, caller: Caller) -> Load:
        catalog, worker = self.catalog, self.worker
        in_memory = {m.spec: m.nbytes for m in worker.models.resident}
        models = [
            {**self._model_entry(name, spec), "memory_bytes": in_memory.get(spec, 0)}
            for name, spec in catalog.listed().items()
        ] + [self._adapter_entry(adapter) for adapter in catalog.adapters.all()]
        memory = {
            "budget_bytes": worker.memory_budget,
            "weights_bytes": worker.models.weight_bytes(),
            "kv_cache_bytes": worker.kv_bytes,
            "prompt_cache_bytes": worker.prompt_cache.nbytes,
        }
        return Load(
            next(iter(catalog.served)),
            worker.running,
            worker.waiting,
            memory,
            [m for m in models if caller.allows(m["id"], m.get("base"))],
        )

    def _model_entry(self, model_id: str, spec: ModelSpec) -> dict:
        """A model as /v1/models lists it: `input_modalities` says which media it takes
        besides text (images, video, audio; as OpenRouter's model list does), `state` whether it is in memory, `kind` and
        `context_length` (also as vLLM spells it, `max_model_len`) what a client needs to
        use it; `pinned` and `size_bytes` (its weights on disk) what the web app shows."""
        context = self.catalog.context_length(spec)
        resident = any(m.spec.path == spec.path for m in self.worker.models.resident)
        return {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "mlxserve",
            "kind": spec.kind,
            "input_modalities": ["text", *(m for m in MEDIA if m in spec.media)],
            "context_length": context,
            "max_model_len": context,
            "state": "loaded" if resident else "not-loaded",
            "pinned": self.worker.models.pinned(spec),
            "size_bytes": stored_bytes(spec),
        }

    def _adapter_entry(self, adapter: DeclaredAdapter) -> dict:
        """An adapter as /v1/models lists it: its base's entry, as `kind: "adapter"`
        with the `base` it runs on."""
        base = self.catalog.served[adapter.base]
        loaded = next((m for m in self.worker.models.resident if m.spec == base), None)
        held = loaded.adapters.resident if loaded is not None and loaded.adapters else []
        resident = next((r for r in held if r.name == adapter.name), None)
        size = sum(f.stat().st_size for f in adapter.path.glob("*.safetensors"))
        return {
            **self._model_entry(adapter.name, base),
            "kind": "adapter",
            "base": adapter.base,
            "state": "loaded" if resident is not None else "not-loaded",
            "pinned": self.catalog.adapters.pinned(adapter.name),
            "size_bytes": size,
            "memory_bytes": resident.nbytes if resident is not None else 0,
        }

    def health(self) -> tuple[int, dict]:
        """GET /health: 503 while the generation thread is down (models may be unloaded
        when idle and load on demand: serving needs the thread)."""
        if not self.worker.alive:
            return 503, {"status": "unavailable"}
        body: dict[str, Any] = {"status": "ok", "model": self.catalog.alias}
        cache = self.worker.prompt_cache
        if cache.has_disk:
            failure = cache.disk_failure
            body["prompt_cache_disk"] = {"enabled": failure is None, "error": failure}
        return 200, body

    # Residency as a request or an operator asks for it -------------------------------------

    @property
    def resident(self) -> list[LoadedModel]:
        return self.worker.models.resident

    def is_resident(self, spec: ModelSpec) -> bool:
        return self.worker.models.holds(spec)

    def keep_alive(self, spec: ModelSpec, seconds: float | None) -> None:
        """Keep `spec` resident this long once idle (math.inf: until unloaded; None: the
        server's --idle-unload-seconds)."""
        self.worker.models.keep_for(spec, seconds)

    def keep_time(self, spec: ModelSpec) -> float | None:
        return self.worker.models.keep_time(spec)

    def idle_for(self, spec: ModelSpec) -> float:
        return self.worker.models.idle_for(spec)

    def ensure_loaded(self, spec: ModelSpec) -> int:
        """Load `spec` now unless it is resident: the nanoseconds the load took."""
        if self.is_resident(spec):
            self.worker.models.touch(spec)
            return 0
        start = time.perf_counter_ns()
        self.worker.call(lambda: self.worker.load(spec))
        return time.perf_counter_ns() - start

    def expire(self, spec: ModelSpec) -> bool:
        """Unload `spec` now if nothing uses or pins it; whether it was."""
        return self.worker.expire(spec)

    def load(self, name: str) -> None:
        """Make a model (or an adapter) resident now."""
        spec = self.catalog.resolve(name)
        adapter = self.catalog.adapter(name)
        worker = self.worker
        if adapter is not None:
            worker.call(lambda: worker.adapters.ready(spec, adapter.name))
        else:
            worker.call(lambda: worker.load(spec))

    def unload(self, name: str) -> None:
        """Free a model's (or an adapter's) memory now (a 409 while it is busy; an
        adapter is read again when next asked for)."""
        spec = self.catalog.resolve(name)
        adapter = self.catalog.adapter(name)
        worker = self.worker
        if adapter is not None:
            worker.call(lambda: worker.adapters.unload(spec, adapter.name))
        else:
            worker.call(lambda: worker.unload(spec))

    def pin(self, name: str, pinned: bool) -> None:
        """Keep a model (or an adapter) resident, or let it go again, whatever --pin said."""
        adapter = self.catalog.adapter(name)
        if adapter is not None:
            self.catalog.adapters.pin(adapter.name, pinned)
        else:
            self.worker.models.pin(self.catalog.resolve(name), pinned)

    # Adapters served at run time -------------------------------------------------------------

    def add_adapter(self, name: str, path: str, model: str | None) -> None:
        """Serve the folder `path` as the adapter `name` on `model`, resident now (its
        folder read and fitted to its base first: a broken or mismatched one is a 400
        naming `path`, and nothing is kept)."""
        catalog, worker = self.catalog, self.worker
        known = catalog.adapters.get(name) is not None
        declared = catalog.declare_adapter(name, path, model)
        spec = catalog.served[declared.base]
        try:
            worker.call(lambda: worker.adapters.ready(spec, name))
        except ServiceError as e:
            if not known:
                catalog.adapters.forget(name)
            if e.code == "adapter_invalid":  # its folder: the body's `path`
                raise ServiceError(e.kind, e.message, "path", e.code) from e
            raise

    def remove_adapter(self, name: str) -> None:
        """Stop serving an adapter (its memory set free); a 409 while requests use it."""
        catalog, worker = self.catalog, self.worker
        adapter = catalog.adapters.get(name)
        if adapter is None:
            raise not_found(
                f"No adapter '{name}' is served.", param="name", code="adapter_not_found"
            )
        spec = catalog.served[adapter.base]

        def remove() -> None:  # on the generation thread: no request is admitted meanwhile
            worker.adapters.unload(spec, name)
            catalog.adapters.forget(name)

        worker.call(remove)

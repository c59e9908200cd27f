"""ModelCatalog: what this server can serve. The --model ones by name (the first the
default) and their aliases, a --model-dir's folders and the hub cache's models, the
adapters declared on them; each model's settings, context length and tokenizer (kept for
the few most recent models). Which models are in memory is the engine's
(engine/memory/resident_set.py).

Runs on HTTP threads: files and tokenizers, no MLX."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxserve.adapters.folder import AdapterError, adapter_files
from mlxserve.adapters.registry import AdapterRegistry, DeclaredAdapter
from mlxserve.config import ModelSettings, ServerConfig
from mlxserve.models.capabilities import (
    PIPELINE_INDEX,
    is_model_folder,
    is_pipeline_folder,
    loads_as_text,
    trained_context,
)
from mlxserve.models.demo import is_demo_name
from mlxserve.models.locations import (
    REPO_ID,
    cached_hub_models,
    converted_root,
    hub_snapshot,
    is_inside,
    resolve_model_path,
)
from mlxserve.models.spec import ModelSpec, load_error
from mlxserve.models.tokenizer import load_text_tokenizer
from mlxserve.models.vision_loader import load_vision_processor
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request, not_found

_TOKENIZER_SLOTS = 4


class ModelCatalog:
    def __init__(self, config: ServerConfig, paths: list[Path]):
        """`paths`: the folders of the served models (config.models), in order; the first
        is the default, and the one --adapter-path and --draft-model apply to."""
        self.config = config
        self.alias = config.model
        self.served: dict[str, ModelSpec] = {}
        self._settings: dict[ModelSpec, ModelSettings] = {}
        for i, (settings, path) in enumerate(zip(config.models, paths, strict=True)):
            draft = settings.draft_model or (config.draft_model if i == 0 else None)
            adapter = config.adapter_path if i == 0 else None
            spec = self._spec(path, adapter, resolve_model_path(draft) if draft else None)
            self.served[settings.served_name] = spec
            self._settings[spec] = settings
        self.default = next(iter(self.served.values()))
        self.adapters = AdapterRegistry()
        for option in config.lora:
            try:
                self.declare_adapter(option.name, str(option.path), option.model)
            except ServiceError as e:
                raise SystemExit(f"mlxserve: --lora {option.name}: {e.message}") from None
        converted = [converted_root()] if config.cached_models else []
        self._model_dirs = [d.expanduser().resolve() for d in [*config.model_dirs, *converted]]
        self._tokenizers: dict[Path, Any] = {}
        self._processors: dict[Path, Any] = {}
        self._kept_lock = threading.Lock()

    # What a request may name -------------------------------------------------------------

    def resolve(self, requested: str | None) -> ModelSpec:
        """The spec for a request's `model` (an adapter's: its base model's), or a 404 if
        this server may not serve it."""
        requested = self.unalias(requested)
        if not requested or requested == "default":
            return self.default
        adapter = self.adapters.get(requested)
        if adapter is not None:
            return self.served[adapter.base]
        for name, spec in self.served.items():
            if requested in (name, str(spec.path)) or (
                is_demo_name(requested) and is_demo_name(name)
            ):
                return spec
        path = self._local_path(requested)
        if path is None and REPO_ID.match(requested) and self.config.cached_models:
            path = hub_snapshot(requested)
        if path is None or not is_model_folder(path):
            raise not_found(
                f"The model '{requested}' does not exist or is not available on this server.",
                param="model",
                code="model_not_found",
            )
        for spec in self.served.values():
            if path == spec.path:
                return spec
        return self._spec(path)

    def unalias(self, requested: str | None) -> str | None:
        """The model an alias stands for: an exact name first, else the longest prefix."""
        aliases = [
            *self.config.model_aliases,
            *((alias, s.served_name) for s in self.config.models for alias in s.aliases),
        ]
        for name, model in aliases:
            if name == requested:
                return model
        prefixes = [(n[:-1], m) for n, m in aliases if n.endswith("*")]
        matches = [(len(p), m) for p, m in prefixes if requested and requested.startswith(p)]
        return max(matches)[1] if matches else requested

    def name(self, spec: ModelSpec) -> str:
        """The model's name in logs and metrics: its --model name, else its folder's."""
        for name, served in self.served.items():
            if served == spec:
                return name
        return spec.path.name

    def listed(self) -> dict[str, ModelSpec]:
        """Every model a request may name: served, in a --model-dir, in the hub cache."""
        found = dict(self.served)
        for root in self._model_dirs:
            for config in [
                *sorted(root.glob("*/config.json")),
                *sorted(root.glob("*/*/config.json")),
                *sorted(root.glob(f"*/{PIPELINE_INDEX}")),
                *sorted(root.glob(f"*/*/{PIPELINE_INDEX}")),
            ]:
                folder = config.parent.resolve()
                if not is_inside(folder, root):  # a link out of the folder is no model of it
                    continue
                if is_pipeline_folder(folder.parent):  # a component of a pipeline
                    continue
                found.setdefault(str(config.parent.relative_to(root)), self._spec(folder))
        for repo_id, path in cached_hub_models() if self.config.cached_models else []:
            found.setdefault(repo_id, self._spec(path))
        return found

    def _spec(self, path: Path, adapter: str | None = None, draft: Path | None = None) -> ModelSpec:
        as_text = self.config.text_only and loads_as_text(path)
        return ModelSpec(path, adapter, draft, as_text)

    def _local_path(self, requested: str) -> Path | None:
        """A folder the request may load: inside the served model's folder or a --model-dir."""
        candidates = [d / requested for d in self._model_dirs]
        if requested.startswith(("/", ".", "~")):
            candidates.insert(0, Path(requested).expanduser())
        roots = [*(spec.path for spec in self.served.values()), *self._model_dirs]
        for candidate in candidates:
            try:
                resolved = candidate.resolve()
                found = resolved.exists()
            except (OSError, ValueError):  # not a possible path (a NUL byte, too long)
                continue
            if found and any(is_inside(resolved, root) for root in roots):
                return resolved
        return None

    # Adapters ------------------------------------------------------------------------------

    def adapter(self, requested: str | None) -> DeclaredAdapter | None:
        """The adapter a request's `model` names, if it names one."""
        return self.adapters.get(self.unalias(requested))

    def declare_adapter(self, name: str, path: str, model: str | None) -> DeclaredAdapter:
        """Serve the adapter folder `path` as `name` on the served model `model` (None: the
        default): its folder is checked here (its fit to the model when it is loaded);
        a 400 naming the field otherwise, a 409 for a name taken by another."""
        base = model or next(iter(self.served))
        if base not in self.served:
            served = ", ".join(self.served)
            raise bad_request(
                f"An adapter applies to a served model ({served}), not '{base}'.", param="model"
            )
        spec = self.served[base]
        if spec.kind != "chat" or spec.adapter_path:
            why = (
                "--adapter-path applies one already"
                if spec.adapter_path
                else f"it is a {spec.kind} model"
            )
            raise bad_request(
                f"{base} does not take adapters ({why}); they are served on text models.",
                param="model",
                code="adapter_invalid",
            )
        folder = Path(path).expanduser().resolve()
        try:
            adapter_files(folder)
        except AdapterError as e:
            raise bad_request(
                f"The adapter folder cannot be served: {e}.", "path", "adapter_invalid"
            ) from e
        declared = DeclaredAdapter(name, folder, base)
        taken = self.adapters.get(name)
        if name in self.served or (taken is not None and taken != declared):
            raise ServiceError(
                ErrorKind.CONFLICT,
                f"The name '{name}' is already served"
                + (f" (an adapter from {taken.path})" if taken else " (a model)")
                + "; unload it first, or choose another name.",
                param="name",
                code="name_taken",
            )
        self.adapters.declare(declared)
        return declared

    # What each model is served with ---------------------------------------------------------

    def config_for(self, spec: ModelSpec) -> ServerConfig:
        """The configuration `spec` is served with: its own settings over the server's."""
        return self.config.for_model(self._settings.get(spec))

    def context_length(self, spec: ModelSpec) -> int | None:
        """Most tokens one sequence may hold, prompt and output: the model's own context
        length, lowered by --max-context; None when neither is known."""
        limit = self.config_for(spec).max_context
        return min([n for n in (trained_context(spec.path), limit) if n], default=None)

    def tokenizer(self, spec: ModelSpec):
        """The tokenizer for `spec`, loaded once and kept for the few most recent models."""
        trust = self.config.trust_remote_code
        return self._kept(self._tokenizers, spec, lambda: load_text_tokenizer(spec.path, trust))

    def processor(self, spec: ModelSpec):
        """A vision model's processor (image preprocessing and prompt expansion)."""
        trust = self.config.trust_remote_code
        return self._kept(self._processors, spec, lambda: load_vision_processor(spec.path, trust))

    def loaded_tokenizer(self, spec: ModelSpec):
        """The model's tokenizer if it has been loaded (None: reading it would cost a
        load)."""
        with self._kept_lock:
            return self._tokenizers.get(spec.path)

    def _kept(self, kept: dict[Path, Any], spec: ModelSpec, load: Callable[[], Any]):
        with self._kept_lock:
            if spec.path not in kept:
                try:
                    loaded = load()
                except Exception as e:
                    raise load_error(spec, e) from e
                if len(kept) >= _TOKENIZER_SLOTS:
                    kept.pop(next(iter(kept)))
                kept[spec.path] = loaded
            return kept[spec.path]

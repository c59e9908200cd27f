"""ModelProvider: resolves model ids to folders and keeps several models resident (least
recently used first out, when the generation thread needs the memory); reading one is
its loader's (models/loader.py), what a model is its spec's (models/spec.py).

Resolving and tokenizers run on HTTP threads (no MLX); unloading runs on the generation
thread, the only one that touches MLX.
"""

from __future__ import annotations

import gc
import logging
import math
import re
import threading
import time
from collections import OrderedDict
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
    is_text_model,
    loads_as_text,
    trained_context,
)
from mlxserve.models.demo import cache_root, ensure_demo_model, is_demo_name
from mlxserve.models.kinds import KINDS
from mlxserve.models.loader import LoadedModel, ModelLoader, load_error
from mlxserve.models.spec import ModelSpec, stored_bytes
from mlxserve.models.tokenizer import load_text_tokenizer
from mlxserve.models.vision_loader import load_vision_processor
from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request, not_found

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_TOKENIZER_SLOTS = 4


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of a hub repo: from the cache, else downloaded if online."""
    from huggingface_hub import snapshot_download

    for local_only in (True, False):
        try:
            return Path(snapshot_download(repo_id, local_files_only=local_only))
        except Exception as e:
            log.debug("hub lookup of %s (local_only=%s) failed: %s", repo_id, local_only, e)
    return None


def resolve_model_path(name: str) -> Path:
    """Where the model named on the command line lives (demo, a folder or a hub repo)."""
    if is_demo_name(name):
        return ensure_demo_model()
    path = Path(name).expanduser()
    if path.exists():
        return path.resolve()
    if _REPO_ID.match(name) and (snapshot := _hub_snapshot(name)):
        return snapshot
    raise SystemExit(
        f"mlxserve: model {name!r} is neither a folder nor a hub repo in the cache; give a "
        "model folder, or download it first with `mlxserve pull REPO` (`mlxserve ls` lists "
        "the models you have)."
    )


class ModelProvider:
    def __init__(
        self,
        config: ServerConfig,
        paths: list[Path],
        split: Callable[[Any], None] | None = None,
    ):
        """`paths`: the folders of the served models (config.models), in order; the first
        is the default, and the one --adapter-path and --draft-model apply to. `split`:
        splits a model across the ranks of a distributed server before its weights
        are read (each rank then reads only its share)."""
        self.config = config
        self.loader = ModelLoader(config, self.tokenizer, split)
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
        self._resident: OrderedDict[ModelSpec, LoadedModel] = OrderedDict()  # LRU first
        self._resident_lock = threading.Lock()  # changed on one thread, read on all
        self._last_used: dict[ModelSpec, float] = {}
        self._pins: dict[ModelSpec, bool] = {}  # set by admin requests, over the config
        # Seconds each model stays resident once idle, as a request asked (Ollama's
        # keep_alive; math.inf: until unloaded), over --idle-unload-seconds
        self._keep: dict[ModelSpec, float] = {}

    # HTTP threads ---------------------------------------------------------------------

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
        if path is None and _REPO_ID.match(requested) and self.config.cached_models:
            path = _hub_snapshot(requested)
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

    def adapter_entry(self, adapter: DeclaredAdapter) -> dict:
        """An adapter as /v1/models lists it: its base's entry, as `kind: "adapter"`
        with the `base` it runs on."""
        base = self.served[adapter.base]
        loaded = next((m for m in self.resident if m.spec == base), None)
        held = loaded.adapters.resident if loaded is not None and loaded.adapters else []
        resident = next((r for r in held if r.name == adapter.name), None)
        size = sum(f.stat().st_size for f in adapter.path.glob("*.safetensors"))
        return {
            **self.model_entry(adapter.name, base),
            "kind": "adapter",
            "base": adapter.base,
            "state": "loaded" if resident is not None else "not-loaded",
            "pinned": self.adapters.pinned(adapter.name),
            "size_bytes": size,
            "memory_bytes": resident.nbytes if resident is not None else 0,
        }

    def _spec(self, path: Path, adapter: str | None = None, draft: Path | None = None) -> ModelSpec:
        as_text = self.config.text_only and loads_as_text(path)
        return ModelSpec(path, adapter, draft, as_text)

    def name(self, spec: ModelSpec) -> str:
        """The model's name in logs and metrics: its --model name, else its folder's."""
        for name, served in self.served.items():
            if served == spec:
                return name
        return spec.path.name

    def memory_by_model(self) -> list[tuple[str, int]]:
        """(name, weight bytes) of each model in memory."""
        return [(self.name(m.spec), m.nbytes) for m in self.resident]

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
            if found and any(_is_inside(resolved, root) for root in roots):
                return resolved
        return None

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

    def model_entry(self, model_id: str, spec: ModelSpec) -> dict:
        """A model as /v1/models lists it: `input_modalities` says whether it takes images
        (as OpenRouter's model list does), `state` whether it is in memory, `kind` and
        `context_length` (also as vLLM spells it, `max_model_len`) what a client needs to
        use it; `pinned` and `size_bytes` (its weights on disk) what the web app shows."""
        context = self.context_length(spec)
        resident = any(m.spec.path == spec.path for m in self.resident)
        return {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "mlxserve",
            "kind": spec.kind,
            "input_modalities": ["text", "image"] if spec.vision else ["text"],
            "context_length": context,
            "max_model_len": context,
            "state": "loaded" if resident else "not-loaded",
            "pinned": self.pinned(spec),
            "size_bytes": stored_bytes(spec),
        }

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
                if not _is_inside(folder, root):  # a link out of the folder is no model of it
                    continue
                if is_pipeline_folder(folder.parent):  # a component of a pipeline
                    continue
                found.setdefault(str(config.parent.relative_to(root)), self._spec(folder))
        for repo_id, path in cached_hub_models() if self.config.cached_models else []:
            found.setdefault(repo_id, self._spec(path))
        return found

    def loaded_tokenizer(self, spec: ModelSpec):
        """The model's tokenizer if it has been loaded (None: reading it would cost a
        load)."""
        with self._kept_lock:
            return self._tokenizers.get(spec.path)

    def pinned(self, spec: ModelSpec) -> bool:
        """Never unloaded for memory or idleness: --pin / a model's `pin`, unless an admin
        request (POST /v1/models/pin) said otherwise since."""
        if spec in self._pins:
            return self._pins[spec]
        return bool(self.config_for(spec).pin) and spec in self.served.values()

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
        seconds = self._keep.get(spec, self.config.idle_unload_seconds)
        return None if seconds is None or seconds == math.inf else seconds

    @property
    def keeps_any(self) -> bool:
        """Whether some model is unloaded once idle long enough (the loop then looks)."""
        return self.config.idle_unload_seconds is not None or any(
            seconds != math.inf for seconds in self._keep.values()
        )

    # Residency (read anywhere, changed on the generation thread) -----------------------

    @property
    def resident(self) -> list[LoadedModel]:
        """The models in memory, least recently used first."""
        with self._resident_lock:
            return list(self._resident.values())

    def touch(self, spec: ModelSpec) -> None:
        """A model was just used: it is the last to be unloaded for memory or idleness."""
        with self._resident_lock:
            if spec in self._resident:
                self._resident.move_to_end(spec)
                self._last_used[spec] = time.monotonic()

    def idle_for(self, spec: ModelSpec) -> float:
        return time.monotonic() - self._last_used.get(spec, time.monotonic())

    def weight_bytes(self) -> int:
        """The weights of every resident model."""
        return sum(m.nbytes for m in self.resident)

    def unload(self, spec: ModelSpec) -> None:
        """Free a model's weights (and MLX's cached buffers)."""
        import mlx.core as mx

        with self._resident_lock:
            if self._resident.pop(spec, None) is None:
                return
            self._last_used.pop(spec, None)
        gc.collect()
        mx.clear_cache()
        log.info("Unloaded %s", spec.path)

    def activate(self, spec: ModelSpec) -> LoadedModel:
        """The model `spec` in memory, loaded now if it is not resident (the caller made
        room for it); a failed load leaves the resident models as they were."""
        if spec in self._resident:
            self.touch(spec)
            return self._resident[spec]
        return self.install(self.loader.read(spec))

    def install(self, loaded: LoadedModel) -> LoadedModel:
        """Make a model `read` resident; if the same model became resident meanwhile (an
        admin load), that one stays and this copy is dropped."""
        with self._resident_lock:
            loaded = self._resident.setdefault(loaded.spec, loaded)
        self.touch(loaded.spec)
        return loaded


def converted_root() -> Path:
    """Where `mlxserve pull --quantize` writes the models it converts."""
    return cache_root() / "converted"


def cached_hub_models() -> list[tuple[str, Path]]:
    """(repo id, snapshot) of MLX-loadable models in the Hugging Face cache; none if the
    cache does not exist."""
    from huggingface_hub import scan_cache_dir

    try:
        repos = scan_cache_dir().repos
    except Exception:
        return []
    found = []
    for repo in repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            names = {f.file_name for f in revision.files}
            has_weights = any(n.endswith(".safetensors") for n in names)
            snapshot = Path(revision.snapshot_path)
            has_config = "config.json" in names or PIPELINE_INDEX in names
            if has_config and has_weights and _loadable(snapshot):
                found.append((repo.repo_id, snapshot))
                break
    return sorted(found)


def _loadable(path: Path) -> bool:
    return is_text_model(path) or KINDS.of(path) is not KINDS.fallback

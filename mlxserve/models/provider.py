"""ModelProvider: resolves model ids to folders, loads them, hot-swaps between them.

Resolving and tokenizers run on HTTP threads (no MLX); `activate` runs on the
generation thread, the only one that touches MLX.
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxserve.config import ServerConfig
from mlxserve.models.capabilities import is_text_model, is_vision_model, trained_context
from mlxserve.models.demo import ensure_demo_model, is_demo_name
from mlxserve.models.tokenizer import load_text_tokenizer
from mlxserve.models.vision import load_vision_model, load_vision_processor
from mlxserve.protocol.errors import ServiceError, bad_request, not_found

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_TOKENIZER_SLOTS = 4


@dataclass(frozen=True)
class ModelSpec:
    """Which weights to serve: the identity the prompt cache and hot-swap key on."""

    path: Path
    adapter_path: str | None = None
    draft_path: Path | None = None

    @property
    def key(self) -> str:
        return f"{self.path}|{self.adapter_path}|{self.draft_path}"

    @property
    def vision(self) -> bool:
        """Takes images: served by mlx-vlm instead of mlx-lm."""
        return is_vision_model(self.path)


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any  # an mlx-lm model, or an mlx-vlm one when spec.vision
    tokenizer: Any
    draft_model: Any | None
    nbytes: int = 0  # the weights' memory, the draft model's included


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


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
    raise SystemExit(f"mlxserve: model {name!r} is neither a folder nor a reachable hub repo")


class ModelProvider:
    def __init__(self, config: ServerConfig, default_path: Path):
        self.config = config
        self.alias = config.model
        draft = resolve_model_path(config.draft_model) if config.draft_model else None
        self.default = ModelSpec(default_path, config.adapter_path, draft)
        self._model_dirs = [d.expanduser().resolve() for d in config.model_dirs]
        self._tokenizers: dict[Path, Any] = {}
        self._processors: dict[Path, Any] = {}
        self._kept_lock = threading.Lock()
        self._loaded: LoadedModel | None = None

    # HTTP threads ---------------------------------------------------------------------

    def resolve(self, requested: str | None) -> ModelSpec:
        """The spec for a request's `model`, or a 404 if this server may not serve it."""
        requested = self.unalias(requested)
        if not requested or requested in (self.alias, "default", str(self.default.path)):
            return self.default
        if is_demo_name(requested) and is_demo_name(self.alias):
            return self.default
        path = self._local_path(requested)
        if path is None and _REPO_ID.match(requested):
            path = _hub_snapshot(requested)
        if path is None or not _is_model_folder(path):
            raise not_found(
                f"The model '{requested}' does not exist or is not available on this server.",
                param="model",
                code="model_not_found",
            )
        return self.default if path == self.default.path else ModelSpec(path)

    def name(self, spec: ModelSpec) -> str:
        """The model's name in logs and metrics: the server's alias for its own model."""
        return self.alias if spec == self.default else spec.path.name

    def memory_by_model(self) -> list[tuple[str, int]]:
        """(name, weight bytes) of each model in memory."""
        loaded = self._loaded
        return [(self.name(loaded.spec), loaded.nbytes)] if loaded is not None else []

    def unalias(self, requested: str | None) -> str | None:
        """The model an alias stands for: an exact name first, else the longest prefix."""
        aliases = self.config.model_aliases
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
        roots = [self.default.path, *self._model_dirs]
        for candidate in candidates:
            try:
                resolved = candidate.resolve()
                found = resolved.exists()
            except (OSError, ValueError):  # not a possible path (a NUL byte, too long)
                continue
            if found and any(_is_inside(resolved, root) for root in roots):
                return resolved
        return None

    def context_length(self, spec: ModelSpec) -> int | None:
        """Most tokens one sequence may hold, prompt and output: the model's own context
        length, lowered by --max-context; None when neither is known."""
        limits = [n for n in (trained_context(spec.path), self.config.max_context) if n]
        return min(limits, default=None)

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
                    raise _load_error(spec, e) from e
                if len(kept) >= _TOKENIZER_SLOTS:
                    kept.pop(next(iter(kept)))
                kept[spec.path] = loaded
            return kept[spec.path]

    def list_models(self) -> list[dict]:
        """Servable models; `input_modalities` says which take images (as OpenRouter's
        model list does)."""
        found = {self.alias: self.default.path}
        for root in self._model_dirs:
            for config in [
                *sorted(root.glob("*/config.json")),
                *sorted(root.glob("*/*/config.json")),
            ]:
                found.setdefault(str(config.parent.relative_to(root)), config.parent)
        for repo_id, path in _cached_hub_models():
            found.setdefault(repo_id, path)
        return [
            {
                "id": model_id,
                "object": "model",
                "created": 0,
                "owned_by": "mlxserve",
                "input_modalities": ["text", "image"] if is_vision_model(path) else ["text"],
            }
            for model_id, path in found.items()
        ]

    # Generation thread ----------------------------------------------------------------

    @property
    def loaded(self) -> LoadedModel | None:
        return self._loaded

    def activate(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` the loaded model; on failure the previous one stays loaded."""
        if self._loaded is not None and self._loaded.spec == spec:
            return self._loaded
        import mlx.core as mx

        log.info("Loading model from %s (%s)", spec.path, "vision" if spec.vision else "text")
        start = time.perf_counter()
        try:
            model, draft = self._load_weights(spec)
            tokenizer = self.tokenizer(spec)
        except ServiceError:
            raise
        except Exception as e:
            raise _load_error(spec, e) from e
        # The previous model's arrays go now; MLX keeps freed buffers for reuse unless told.
        self._loaded = None
        gc.collect()
        mx.clear_cache()
        self._loaded = LoadedModel(spec, model, tokenizer, draft, _weight_bytes(model, draft))
        log.info(
            "Loaded %s in %.1fs (peak memory %.2f GB, active %.2f GB)",
            spec.path,
            time.perf_counter() - start,
            mx.get_peak_memory() / 1e9,
            mx.get_active_memory() / 1e9,
        )
        mx.reset_peak_memory()
        return self._loaded

    def _load_weights(self, spec: ModelSpec) -> tuple[Any, Any | None]:
        """(model, draft model or None)."""
        from mlx_lm.utils import load_adapters, load_model

        trust = self.config.trust_remote_code
        if spec.vision:
            return load_vision_model(spec.path, spec.adapter_path), None
        model, _ = load_model(spec.path, trust_remote_code=trust)
        if spec.adapter_path:
            model = load_adapters(model, spec.adapter_path)
            model.eval()
        draft = load_model(spec.draft_path)[0] if spec.draft_path else None
        return model, draft


def _weight_bytes(*models: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(
        array.nbytes
        for model in models
        if model is not None
        for _, array in tree_flatten(model.parameters())
    )


def _load_error(spec: ModelSpec, error: Exception) -> ServiceError:
    log.error("Loading %s failed: %s", spec.path, error)
    return bad_request(
        f"The model at '{spec.path.name}' could not be loaded: {error}",
        param="model",
        code="model_load_failed",
    )


def _cached_hub_models() -> list[tuple[str, Path]]:
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
            if "config.json" in names and has_weights and _loadable(snapshot):
                found.append((repo.repo_id, snapshot))
                break
    return sorted(found)


def _loadable(path: Path) -> bool:
    return is_text_model(path) or is_vision_model(path)

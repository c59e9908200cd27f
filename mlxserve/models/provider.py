"""ModelProvider: resolves model ids to folders, loads them, hot-swaps between them.

Resolving and tokenizers run on HTTP threads (no MLX); `activate` runs on the
generation thread, the only one that touches MLX.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxserve.api.errors import APIError, not_found
from mlxserve.config import ServerConfig
from mlxserve.models.demo import ensure_demo_model, is_demo_name
from mlxserve.models.tokenizer import load_text_tokenizer

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


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any
    tokenizer: Any
    draft_model: Any | None


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
        self._tokenizer_lock = threading.Lock()
        self._loaded: LoadedModel | None = None

    # HTTP threads ---------------------------------------------------------------------

    def resolve(self, requested: str | None) -> ModelSpec:
        """The spec for a request's `model`, or a 404 if this server may not serve it."""
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

    def _local_path(self, requested: str) -> Path | None:
        """A folder the request may load: inside the served model's folder or a --model-dir."""
        candidates = [d / requested for d in self._model_dirs]
        if requested.startswith(("/", ".", "~")):
            candidates.insert(0, Path(requested).expanduser())
        roots = [self.default.path, *self._model_dirs]
        for candidate in candidates:
            resolved = candidate.resolve()
            if resolved.exists() and any(_is_inside(resolved, root) for root in roots):
                return resolved
        return None

    def tokenizer(self, spec: ModelSpec):
        """The tokenizer for `spec`, loaded once and kept for the few most recent models."""
        with self._tokenizer_lock:
            if spec.path not in self._tokenizers:
                try:
                    tokenizer = load_text_tokenizer(spec.path, self.config.trust_remote_code)
                except Exception as e:
                    raise _load_error(spec, e) from e
                if len(self._tokenizers) >= _TOKENIZER_SLOTS:
                    self._tokenizers.pop(next(iter(self._tokenizers)))
                self._tokenizers[spec.path] = tokenizer
            return self._tokenizers[spec.path]

    def list_models(self) -> list[dict]:
        ids = [self.alias]
        for root in self._model_dirs:
            ids += [str(p.parent.relative_to(root)) for p in sorted(root.glob("*/config.json"))]
            ids += [str(p.parent.relative_to(root)) for p in sorted(root.glob("*/*/config.json"))]
        ids += _cached_hub_models()
        unique = list(dict.fromkeys(ids))
        return [{"id": i, "object": "model", "created": 0, "owned_by": "mlxserve"} for i in unique]

    # Generation thread ----------------------------------------------------------------

    @property
    def loaded(self) -> LoadedModel | None:
        return self._loaded

    def activate(self, spec: ModelSpec) -> LoadedModel:
        """Make `spec` the loaded model; on failure the previous one stays loaded."""
        if self._loaded is not None and self._loaded.spec == spec:
            return self._loaded
        import mlx.core as mx
        from mlx_lm.utils import load_adapters, load_model

        log.info("Loading model from %s", spec.path)
        start = time.perf_counter()
        try:
            model, _ = load_model(spec.path, trust_remote_code=self.config.trust_remote_code)
            if spec.adapter_path:
                model = load_adapters(model, spec.adapter_path)
                model.eval()
            draft = load_model(spec.draft_path)[0] if spec.draft_path else None
            tokenizer = self.tokenizer(spec)
        except APIError:
            raise
        except Exception as e:
            raise _load_error(spec, e) from e
        self._loaded = None
        gc.collect()
        mx.clear_cache()
        self._loaded = LoadedModel(spec, model, tokenizer, draft)
        log.info(
            "Loaded %s in %.1fs (peak memory %.2f GB)",
            spec.path,
            time.perf_counter() - start,
            mx.get_peak_memory() / 1e9,
        )
        return self._loaded


def _load_error(spec: ModelSpec, error: Exception) -> APIError:
    log.error("Loading %s failed: %s", spec.path, error)
    return APIError(
        400,
        f"The model at '{spec.path.name}' could not be loaded: {error}",
        param="model",
        code="model_load_failed",
    )


def _cached_hub_models() -> list[str]:
    """MLX-loadable models in the Hugging Face cache; none if the cache does not exist."""
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
            config = revision.snapshot_path / "config.json"
            if "config.json" in names and has_weights and _supported_model_type(config):
                found.append(repo.repo_id)
                break
    return sorted(found)


def _supported_model_type(config_path: Path) -> bool:
    import importlib.util

    try:
        model_type = json.loads(config_path.read_text()).get("model_type", "")
    except (OSError, ValueError):
        return False
    return bool(model_type) and importlib.util.find_spec(f"mlx_lm.models.{model_type}") is not None

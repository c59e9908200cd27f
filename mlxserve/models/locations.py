"""Where models live on this machine: a folder, a Hugging Face hub snapshot, the demo
model, the folder `mlxserve pull --quantize` converts into. Files only, no MLX."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mlxserve.models.capabilities import PIPELINE_INDEX, is_text_model
from mlxserve.models.demo import cache_root, ensure_demo_model, is_demo_name
from mlxserve.models.kinds import KINDS

log = logging.getLogger(__name__)

REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def hub_snapshot(repo_id: str) -> Path | None:
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
    if REPO_ID.match(name) and (snapshot := hub_snapshot(name)):
        return snapshot
    raise SystemExit(
        f"mlxserve: model {name!r} is neither a folder nor a hub repo in the cache; give a "
        "model folder, or download it first with `mlxserve pull REPO` (`mlxserve ls` lists "
        "the models you have)."
    )


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

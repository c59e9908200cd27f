"""The prompt cache's disk tier: KV caches as safetensors files in one folder, capped in
total size, oldest-used removed first. Files carry their model key and tokens in the
safetensors header, so a restarted server finds them without loading any array."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache, save_prompt_cache
from safetensors import safe_open

from mlxserve.engine.token_prefix import usable_prefix

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
MODEL_FIELD = "mlxserve.model"
TOKENS_FIELD = "mlxserve.tokens"
TRIMMABLE_FIELD = "mlxserve.trimmable"


@dataclass
class _File:
    key: str
    tokens: np.ndarray
    trimmable: bool


class DiskCache:
    def __init__(self, folder: Path, max_bytes: int):
        self._folder = folder
        self._max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[Path, _File] = {}
        for path in folder.glob(f"*{SUFFIX}"):
            found = _read_header(path)
            if found is None:
                log.warning("Ignoring unreadable prompt cache file %s", path)
            else:
                self._files[path] = found
        log.info("Prompt cache disk tier %s: %d entries", folder, len(self._files))

    def __len__(self) -> int:
        return len(self._files)

    def save(self, key: str, tokens: np.ndarray, cache: list[Any]) -> None:
        path = self._folder / f"{_digest(key, tokens)}{SUFFIX}"
        if path in self._files:
            os.utime(path)
            return
        start = time.perf_counter()
        partial = path.with_name(f"{path.stem}.partial{SUFFIX}")
        trimmable = can_trim_prompt_cache(cache)
        metadata = {
            MODEL_FIELD: key,
            TOKENS_FIELD: json.dumps(tokens.tolist()),
            TRIMMABLE_FIELD: json.dumps(trimmable),
        }
        try:
            save_prompt_cache(str(partial), cache, metadata)
            os.replace(partial, path)
        except OSError as e:
            log.warning("Could not write prompt cache file %s: %s", path, e)
            partial.unlink(missing_ok=True)
            return
        self._files[path] = _File(key, tokens, trimmable)
        log.info(
            "Prompt cache: %d tokens written to disk in %.2fs",
            len(tokens),
            time.perf_counter() - start,
        )
        self._shrink()

    def load_longer(
        self, key: str, prompt: np.ndarray, than: int
    ) -> tuple[np.ndarray, list[Any], int] | None:
        """The file that covers more than `than` prompt tokens, most of all: its tokens,
        its cache, and how many prompt tokens it stands for."""
        best, best_len = None, than
        for path, found in self._files.items():
            if found.key == key:
                usable = usable_prefix(found.tokens, prompt, found.trimmable)
                if usable > best_len:
                    best, best_len = path, usable
        if best is None:
            return None
        try:
            cache = load_prompt_cache(str(best))
        except Exception as e:  # a damaged file is a cache miss, never a failed request
            log.warning("Dropping unreadable prompt cache file %s: %s", best, e)
            self._remove(best)
            return None
        os.utime(best)
        return self._files[best].tokens, cache, best_len

    def _shrink(self) -> None:
        sizes = {path: path.stat().st_size for path in self._files}
        total = sum(sizes.values())
        for path in sorted(sizes, key=lambda p: p.stat().st_mtime):
            if total <= self._max_bytes:
                break
            total -= sizes[path]
            self._remove(path)

    def _remove(self, path: Path) -> None:
        self._files.pop(path, None)
        path.unlink(missing_ok=True)


def _digest(key: str, tokens: np.ndarray) -> str:
    return hashlib.sha256(key.encode() + b"\0" + tokens.astype(np.int64).tobytes()).hexdigest()[:32]


def _read_header(path: Path) -> _File | None:
    try:
        with safe_open(str(path), "numpy") as f:
            metadata = f.metadata() or {}
    except Exception:
        return None
    # mlx-lm nests our metadata under a prefix of its own ("0.").
    fields = {name.split(".", 1)[1]: value for name, value in metadata.items() if "." in name}
    try:
        return _File(
            fields[MODEL_FIELD],
            np.asarray(json.loads(fields[TOKENS_FIELD]), dtype=np.int64),
            json.loads(fields[TRIMMABLE_FIELD]),
        )
    except (KeyError, ValueError):
        return None

"""The prompt cache's disk tier: KV caches as safetensors files in one folder, capped in
total size, oldest-used removed first. Files carry their model key and tokens in the
safetensors header, so a restarted server finds them without loading any array, and a
checksum of their bytes in their name, so a damaged file is a miss, never a wrong answer.

The tier is an optimisation: a folder that cannot be written at start, or the first write
that fails later (a full disk), turns it off with one warning, and requests go on from
memory. Files a killed writer left unfinished (`*.partial.safetensors`) are removed at
start."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache, save_prompt_cache
from safetensors import safe_open

from mlxserve.engine.caches.quantized_cache import batchable, portable
from mlxserve.engine.caches.token_prefix import usable_prefix

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
# "<digest of model key and tokens>.<crc32 of the file>.safetensors"
NAME = re.compile(r"^([0-9a-f]{32})\.([0-9a-f]{8})\.safetensors$")
READ_BLOCK = 1 << 20
MODEL_FIELD = "mlxserve.model"
TOKENS_FIELD = "mlxserve.tokens"
TRIMMABLE_FIELD = "mlxserve.trimmable"


@dataclass
class _File:
    key: str
    tokens: np.ndarray
    trimmable: bool
    checksum: str


class DiskCache:
    def __init__(self, folder: Path, max_bytes: int):
        self._folder = folder
        self._max_bytes = max_bytes
        self.failure: str | None = None  # why the tier was turned off; None while it works
        self._files: dict[Path, _File] = {}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._probe()
            self._scan()
        except OSError as e:
            self._turn_off(f"cannot use {folder}: {e}")

    def _probe(self) -> None:
        """Write a file now: an unwritable folder turns the tier off at start, so /health
        says so from the first request instead of after the first eviction."""
        probe = self._folder / f".probe.{os.getpid()}"
        probe.write_bytes(b"mlxserve")
        probe.unlink()

    def _scan(self) -> None:
        for path in self._folder.glob(f"*.partial{SUFFIX}"):  # a killed writer's leftovers
            log.info("Removing an unfinished prompt cache file %s", path.name)
            _unlink(path)
        for path in self._folder.glob(f"*{SUFFIX}"):
            # Only regular files: opening a FIFO would block start-up forever.
            found = _read_header(path) if path.is_file() else None
            if found is None:
                log.warning("Ignoring unreadable prompt cache file %s", path)
            else:
                self._files[path] = found
        log.info("Prompt cache disk tier %s: %d entries", self._folder, len(self._files))

    def __len__(self) -> int:
        return len(self._files)

    def save(self, key: str, tokens: np.ndarray, cache: list[Any]) -> None:
        if self.failure is not None:
            return
        digest = _digest(key, tokens)
        partial = self._folder / f"{digest}.partial{SUFFIX}"
        try:
            saved = [path for path in self._files if path.name.startswith(digest)]
            if saved:
                os.utime(saved[0])  # already on disk: now the most recently used
                return
            self._write(partial, key, tokens, cache)
        except Exception as e:  # MLX reports a failed write as RuntimeError, not OSError
            self._turn_off(f"could not write {partial.name}: {e}")
            _unlink(partial)

    def _write(self, partial: Path, key: str, tokens: np.ndarray, cache: list[Any]) -> None:
        start = time.perf_counter()
        trimmable = can_trim_prompt_cache(cache)
        metadata = {
            MODEL_FIELD: key,
            TOKENS_FIELD: json.dumps(tokens.tolist()),
            TRIMMABLE_FIELD: json.dumps(trimmable),
        }
        save_prompt_cache(str(partial), portable(cache), metadata)
        checksum = _checksum(partial)
        path = self._folder / f"{partial.name.split('.')[0]}.{checksum}{SUFFIX}"
        os.replace(partial, path)
        self._files[path] = _File(key, tokens, trimmable, checksum)
        log.info(
            "Prompt cache: %d tokens written to disk in %.2fs",
            len(tokens),
            time.perf_counter() - start,
        )
        self._shrink()

    def _turn_off(self, reason: str) -> None:
        self.failure = reason
        log.warning("Prompt cache disk tier turned off (%s); the memory tier goes on", reason)

    def load_longer(
        self, key: str, prompt: np.ndarray, than: int
    ) -> tuple[np.ndarray, list[Any], int] | None:
        """The file that covers more than `than` prompt tokens, most of all: its tokens,
        its cache, and how many prompt tokens it stands for."""
        best, best_len = None, than
        if self.failure is not None:
            return None
        for path, found in self._files.items():
            if found.key == key:
                usable = usable_prefix(found.tokens, prompt, found.trimmable)
                if usable > best_len:
                    best, best_len = path, usable
        if best is None:
            return None
        try:
            if _checksum(best) != self._files[best].checksum:
                raise ValueError("its bytes do not match its checksum")
            cache = batchable(load_prompt_cache(str(best)))
        except Exception as e:  # a damaged file is a cache miss, never a failed request
            log.warning("Dropping unreadable prompt cache file %s: %s", best, e)
            self._remove(best)
            return None
        os.utime(best)
        return self._files[best].tokens, cache, best_len

    def _shrink(self) -> None:
        stats = {}
        for path in list(self._files):
            try:
                stats[path] = path.stat()
            except OSError:  # removed by someone else
                self._files.pop(path)
        total = sum(s.st_size for s in stats.values())
        for path in sorted(stats, key=lambda p: stats[p].st_mtime):
            if total <= self._max_bytes:
                break
            total -= stats[path].st_size
            self._remove(path)

    def _remove(self, path: Path) -> None:
        self._files.pop(path, None)
        _unlink(path)


def _digest(key: str, tokens: np.ndarray) -> str:
    return hashlib.sha256(key.encode() + b"\0" + tokens.astype(np.int64).tobytes()).hexdigest()[:32]


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("Could not remove prompt cache file %s: %s", path, e)


def _checksum(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(READ_BLOCK):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _read_header(path: Path) -> _File | None:
    name = NAME.match(path.name)
    if name is None:
        return None
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
            name.group(2),
        )
    except (KeyError, ValueError):
        return None

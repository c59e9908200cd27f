"""The adapters a request may name, each with the served model it applies to: from --lora
at start, and loaded or unloaded at runtime. Any thread (the HTTP threads resolve names,
the generation thread reads weights)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DeclaredAdapter:
    name: str  # what requests send as `model`
    path: Path  # its folder (mlx-lm's or PEFT's layout)
    base: str  # the served model's name


class AdapterRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._declared: dict[str, DeclaredAdapter] = {}
        self._pins: set[str] = set()

    def get(self, name: str | None) -> DeclaredAdapter | None:
        with self._lock:
            return self._declared.get(name) if name else None

    def by_path(self, path: str) -> DeclaredAdapter | None:
        """The adapter served from folder `path` (mlx_lm.server's per-request `adapters`
        names a folder)."""
        try:
            wanted = Path(path).expanduser().resolve()
        except (OSError, ValueError):
            return None
        with self._lock:
            return next((a for a in self._declared.values() if a.path == wanted), None)

    def all(self) -> list[DeclaredAdapter]:
        with self._lock:
            return list(self._declared.values())

    def declare(self, adapter: DeclaredAdapter) -> None:
        with self._lock:
            self._declared[adapter.name] = adapter

    def forget(self, name: str) -> None:
        with self._lock:
            self._declared.pop(name, None)
            self._pins.discard(name)

    def pin(self, name: str, pinned: bool) -> None:
        with self._lock:
            (self._pins.add if pinned else self._pins.discard)(name)

    def pinned(self, name: str) -> bool:
        with self._lock:
            return name in self._pins

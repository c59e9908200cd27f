"""A model's load on a thread of its own, so that the other models' streams go on while
its weights are read (a user picking another model in a chat app must not freeze every
other conversation for the seconds a load takes).

MLX gives each thread its own default stream (from 0.31.2): the loader thread reads and
evaluates the weights there, and the generation thread takes the finished model in one
step, when every array is evaluated (nothing it runs then depends on the loader's work in
flight). One model loads at a time; requests for it wait in the loop's queue meanwhile, as
requests waiting for memory do. Where ranks run in lockstep, loads stay on the generation
thread: every rank must load at the same step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxserve.engine.memory.loader import LoadedModel
from mlxserve.models.spec import ModelSpec, stored_bytes

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Load:
    spec: ModelSpec
    done: threading.Event = field(default_factory=threading.Event)
    loaded: LoadedModel | None = None
    error: Exception | None = None


class BackgroundLoads:
    def __init__(self, read: Callable[[ModelSpec], LoadedModel], wake: Callable[[], None]):
        """`read`: load a model's weights and tokenizer (not yet resident); `wake`: tell
        the generation loop, which may be waiting for work, that a load ended."""
        self._read = read
        self._wake = wake
        self._load: _Load | None = None

    @property
    def loading(self) -> ModelSpec | None:
        """The model whose load runs or ended without being taken yet."""
        return self._load.spec if self._load is not None else None

    def reserved_bytes(self) -> int:
        """The weights of the model being loaded, counted in the memory budget already."""
        return stored_bytes(self._load.spec) if self._load is not None else 0

    def start(self, spec: ModelSpec) -> None:
        """Begin loading `spec` (nothing else loading: see `loading`)."""
        assert self._load is None, "one load at a time"
        load = self._load = _Load(spec)
        thread = threading.Thread(target=self._run, args=(load,), name="model-load", daemon=True)
        thread.start()

    def take(self, spec: ModelSpec) -> LoadedModel | None:
        """`spec`'s model once its load has ended (then the next load may start); None
        while it loads or when it is not the one loading. A failed load raises its error
        here, once."""
        load = self._load
        if load is None or load.spec != spec or not load.done.is_set():
            return None
        self._load = None
        if load.error is not None:
            raise load.error
        return load.loaded

    def _run(self, load: _Load) -> None:
        try:
            load.loaded = self._read(load.spec)
        except Exception as e:  # answered to the requests waiting for it (see `take`)
            load.error = e
        finally:
            load.done.set()
            self._wake()

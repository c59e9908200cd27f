"""The batch store and its runner, opened when first needed: at start where the store
holds batches to resume, else at the first files or batches request (a server that never
serves a batch never takes the store)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from mlxserve.api.batches.runner import BatchRunner, Endpoint, Outputs
from mlxserve.api.errors import ErrorRenderer
from mlxserve.batches.store import BatchStore, StoreBusy
from mlxserve.config import ServerConfig
from mlxserve.keys.gate import KeyGate
from mlxserve.models.demo import cache_root
from mlxserve.protocol.errors import ServiceError, unavailable

log = logging.getLogger(__name__)

STORE_NAME = "batches.sqlite"


def store_path(config: ServerConfig) -> Path:
    """The SQLite file of the server's durable state (files, batches, conversations)."""
    return config.batch_db or cache_root() / STORE_NAME


class BatchKeeper:
    def __init__(
        self,
        config: ServerConfig,
        endpoints: dict[str, Endpoint],
        errors: Callable[[str], ErrorRenderer],
        outputs: dict[str, Outputs],
        keys: KeyGate,
        on_token: Callable[[float], None],
    ):
        """`on_token`: told the time of each token a line generates (the status page's
        tokens per second count batch work too)."""
        self.config = config
        self._on_token = on_token
        self._keys = keys
        self.path = store_path(config)
        self._endpoints = endpoints
        self._errors = errors
        self._outputs = outputs
        self._store: BatchStore | None = None
        self._runner: BatchRunner | None = None
        self._refusal: ServiceError | None = None
        self._lock = threading.Lock()

    def resume(self) -> None:
        """At start: open a store that exists, so that its running batches go on."""
        if self.path.exists():
            try:
                self.store()
            except ServiceError as e:
                log.warning("%s", e.message)

    def store(self) -> BatchStore:
        """The open store, its runner started; a 503 where another server holds it."""
        with self._lock:
            if self._store is not None:
                return self._store
            if self._refusal is not None:
                raise self._refusal
            try:
                store = BatchStore(self.path)
            except StoreBusy as e:
                self._refusal = unavailable(
                    f"The Batch API is off on this server: {e} (give each server its own "
                    "--batch-db)."
                )
                raise self._refusal from e
            runner = BatchRunner(
                store,
                self._endpoints,
                self._errors,
                self._outputs,
                self.config.max_concurrent,
                self._keys,
                self._on_token,
            )
            runner.start()
            self._store, self._runner = store, runner
            log.info("Batch store: %s", self.path)
            return store

    def existing(self) -> BatchStore | None:
        """The store if there is one (opened if need be), without making one: what lists
        read (an empty list where nothing was ever uploaded)."""
        if self._store is None and not self.path.exists():
            return None
        return self.store()

    def wake(self) -> None:
        if self._runner is not None:
            self._runner.wake()

    def stop(self) -> None:
        """Lines running now stay pending: they run again after a restart."""
        with self._lock:
            if self._runner is not None:
                self._runner.stop()
            if self._store is not None:
                self._store.close()
            self._store = self._runner = None
            self._refusal = unavailable("The server is shutting down.")

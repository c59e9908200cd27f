"""Start-up of one rank of a distributed server, what stays single-machine, and what a
failed rank makes rank 0 do."""

from __future__ import annotations

import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxserve.config import ServerConfig
from mlxserve.distributed.control import Address, Hub, Link
from mlxserve.distributed.world import World, largest, share, split_model
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.models.capabilities import is_embedding_model
from mlxserve.protocol.errors import unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Startup:
    """What rank 0 decides for every rank at start."""

    control: Address
    seed: int  # of MLX's random state: unseeded requests sample alike on every rank
    memory_budget: int  # bytes: every rank's decisions must count the same budget


def single_machine_features(config: ServerConfig, paths: list[Path]) -> list[str]:
    """What the configuration asks for that a distributed server cannot do."""
    found = []
    if len(config.models) > 1:
        found.append("serving several models (one --model only)")
    if config.draft_model or any(m.draft_model for m in config.models):
        found.append("a draft model (--draft-model)")
    if config.adapter_path or config.lora:
        found.append("LoRA adapters (--adapter-path, --lora)")
    if config.prompt_cache_dir is not None:
        found.append("the prompt cache's disk tier (--prompt-cache-dir: one per machine)")
    if config.idle_unload_seconds is not None:
        found.append("unloading an idle model (--idle-unload-seconds)")
    for path in paths:
        if is_embedding_model(path):
            found.append(f"an embedding model ({path.name})")
    return found


class Cluster:
    """This rank's place in the group: the split, the shared start-up values, and its
    control line (rank 0: a Hub to every rank; the others: a Link to rank 0)."""

    def __init__(self, world: World, config: ServerConfig, paths: list[Path], budget: int):
        """`budget`: this rank's memory budget (rank 0's counts for all)."""
        unsupported = single_machine_features(config, paths)
        if unsupported:
            raise SystemExit(
                "mlxserve: a distributed server (launched by mlx.launch) cannot serve "
                + "; ".join(unsupported)
            )
        self.world = world
        self.mode = config.distributed
        self.hub: Hub | None = Hub(world.size) if world.leader else None
        mine = (
            Startup(self.hub.address, secrets.randbits(62), budget)
            if self.hub is not None
            else None
        )
        self.startup: Startup = share(world, mine)
        self.link: Link | None = None
        if self.hub is not None:
            self.hub.accept()
        else:
            self.link = Link(self.startup.control, world.rank)
        log.info("Rank %d of %d (pid %d)", world.rank, world.size, os.getpid())

    def seed(self) -> None:
        """Seed MLX's random state (per thread: call it on the generation thread)."""
        mx.random.seed(self.startup.seed)

    def split(self, model: Any) -> None:
        """Split a model being loaded across the ranks (ModelLoader's `split`)."""
        self.mode = split_model(model, self.world, self.mode)
        log.info("Split across %d ranks: %s parallelism", self.world.size, self.mode)

    def check_even(self, accounting: tuple[int, ...]) -> None:
        """Every rank's byte counts (weights, KV cache per token, fixed) must be rank 0's:
        eviction and admission decide by bytes, and every rank must decide alike."""
        leader = share(self.world, accounting if self.world.leader else None)
        if largest(self.world, float(tuple(leader) != tuple(accounting))):
            raise SystemExit(
                "mlxserve: the ranks hold shares of different sizes (weights and KV cache "
                f"bytes {accounting} here, {tuple(leader)} on rank 0): with pipeline "
                "parallelism choose a number of machines that divides the model's layers, "
                "or use --distributed tensor"
            )


def watch_launcher(on_gone: Callable[[], None]) -> None:
    """mlx.launch hands each rank its stdin as a pipe; the pipe ending (the launcher
    killed, an ssh session gone) means nothing can stop this rank any more: call
    `on_gone` then. A thread reads (and drops) whatever arrives meanwhile."""
    if "MLX_RANK" not in os.environ or not stat.S_ISFIFO(os.fstat(0).st_mode):
        return

    def run() -> None:
        while os.read(0, 4096):
            pass
        on_gone()

    threading.Thread(target=run, name="launcher", daemon=True).start()


class FaultHandler:
    """Rank 0's answer to a failed rank: the requests in flight and any new one get a 503,
    open replies get a moment to finish, and the process exits with status 1 (mlx.launch
    then stops the other ranks). The generation thread may be blocked for good in a
    collective: this runs on the thread that noticed."""

    def __init__(self, drain_seconds: float):
        self._drain_seconds = drain_seconds
        self._worker: GenerationWorker | None = None
        self._drain: Callable[[float], bool] = lambda seconds: True
        self._lock = threading.Lock()
        self._failed = False

    def attach(self, worker: GenerationWorker, drain: Callable[[float], bool]) -> None:
        self._worker, self._drain = worker, drain

    def __call__(self, why: str) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
        log.error("A rank of the distributed group failed: %s. Stopping the server.", why)
        if self._worker is not None:
            self._worker.abandon(
                unavailable(f"The server's distributed group failed ({why}); it is stopping.")
            )
        threading.Thread(target=self._exit, name="fault", daemon=True).start()

    def _exit(self) -> None:
        self._drain(self._drain_seconds)
        logging.shutdown()
        os._exit(1)

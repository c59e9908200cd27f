"""Wires the HTTP server, the model catalog and the generation thread together."""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import mlx.core as mx

from mlxserve.api import secret
from mlxserve.api.guards import exposure_warning
from mlxserve.api.handler import APIHandler
from mlxserve.api.routes import Routes
from mlxserve.config import ServerConfig
from mlxserve.console import ready_screen
from mlxserve.distributed.cluster import Cluster, FaultHandler, watch_launcher
from mlxserve.distributed.lockstep import Follower, Leader
from mlxserve.distributed.world import World, join_world
from mlxserve.engine.caches.disk_cache import DiskCache
from mlxserve.engine.caches.prompt_cache import PromptCache
from mlxserve.engine.continuous.continuous_batch import ContinuousBatchLimits
from mlxserve.engine.loop.loop_step import Lockstep
from mlxserve.engine.loop.worker import GenerationWorker
from mlxserve.engine.memory.footprint import CACHE_LIMIT_SHARE, device_memory
from mlxserve.engine.memory.loader import ModelLoader, Split
from mlxserve.engine.memory.resident_set import ResidentSet
from mlxserve.models.catalog import ModelCatalog
from mlxserve.models.demo import cache_root
from mlxserve.models.locations import resolve_model_path
from mlxserve.protocol.errors import ServiceError
from mlxserve.registration import register_all
from mlxserve.service.chat import ChatService
from mlxserve.telemetry.metrics import Metrics
from mlxserve.units import GB, format_bytes

log = logging.getLogger(__name__)

DRAIN_SECONDS = 5  # at shutdown, for open requests to write their last event
SOCKETS_CLOSING_SECONDS = 3  # then for WebSockets to finish their closing handshakes


class MLXServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 makes the 6th of a burst of connections wait for
    # a TCP retransmission (a second or more).
    request_queue_size = socket.SOMAXCONN

    def __init__(self, config: ServerConfig, routes: Routes):
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        super().__init__((config.host, config.port), APIHandler)
        self.config = config
        self.routes = routes
        self._open_requests = 0  # being answered now: shutdown waits for their last bytes
        self._open_lock = threading.Lock()

    def handle_error(self, request, client_address) -> None:
        """A client that closes or resets its connection costs one debug line; anything
        else is a bug, logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("Connection from %s ended: %r", client_address[0], error)
        else:
            log.exception("Error on the connection from %s", client_address[0])

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Counts a request as open while its reply is being written."""
        with self._open_lock:
            self._open_requests += 1
        try:
            yield
        finally:
            with self._open_lock:
                self._open_requests -= 1

    def drain(self, seconds: float) -> bool:
        """Wait up to `seconds` for every open request to finish its reply; whether all did."""
        deadline = time.monotonic() + seconds
        while self._open_requests and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._open_requests

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    @property
    def origin(self) -> str:
        address, port = self.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"


def check_port(config: ServerConfig) -> None:
    """Before minutes of loading: one sentence if the address cannot be served."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((config.host, config.port))
        except OSError as e:
            why = "is in use (another server?)" if e.errno == errno.EADDRINUSE else f"fails: {e}"
            raise SystemExit(
                f"mlxserve: port {config.port} on {config.host} {why}; stop that server or "
                "choose another port with --port."
            ) from e


def build_server(config: ServerConfig, world: World | None = None) -> MLXServer:
    """Resolve and load the served model on the generation thread, then bind the socket.
    `world`: the ranks of a distributed server, this one rank 0."""
    register_all()
    secret.install(config.secret_key, cache_root())
    check_port(config)
    paths, budget = _models_and_budget(config)
    cluster = Cluster(world, config, paths, budget) if world is not None else None
    faults = FaultHandler(DRAIN_SECONDS)
    lockstep = None
    if cluster is not None and cluster.hub is not None:
        lockstep = Leader(cluster.world, cluster.hub, faults)
        budget = cluster.startup.memory_budget
    catalog = ModelCatalog(config, paths)
    worker = start_worker(config, catalog, cluster.split if cluster else None, budget, lockstep)
    if cluster is not None and cluster.hub is not None:
        worker.call(cluster.seed)
        cluster.check_even(worker.call(lambda: worker.residency.accounting(catalog.default)))
        cluster.hub.watch(config.distributed_timeout, faults)
        # Its launcher gone, rank 0 shuts down as on SIGTERM (and the group with it).
        watch_launcher(lambda: os.kill(os.getpid(), signal.SIGTERM))
    metrics = Metrics()
    metrics.watch(
        running=lambda: worker.running,
        waiting=lambda: worker.waiting,
        prompt_cache_bytes=lambda: worker.prompt_cache.nbytes,
        model_bytes=worker.models.memory_by_model,
        mlx_active_bytes=mx.get_active_memory,
        mlx_cache_bytes=mx.get_cache_memory,
        speculation=lambda: [
            (
                catalog.name(spec),
                counts.drafted,
                counts.accepted,
                counts.verified,
                counts.replayed,
            )
            for spec, counts in worker.residency.speculation()
        ],
    )
    server = MLXServer(config, Routes(ChatService(config, catalog, worker), metrics))
    faults.attach(worker, server.drain)
    return server


def _models_and_budget(config: ServerConfig) -> tuple[list[Path], int]:
    """The served models' folders, and this machine's memory budget in bytes."""
    paths = [resolve_model_path(settings.model) for settings in config.models]
    budget = int(config.memory_budget_gb * GB) if config.memory_budget_gb else device_memory()
    return paths, budget


def start_worker(
    config: ServerConfig,
    catalog: ModelCatalog,
    split: Split | None,
    budget: int,
    lockstep: Lockstep | None,
) -> GenerationWorker:
    """The generation thread, started, with every served model loaded."""
    worker = idle_worker(config, catalog, split, budget, lockstep)
    load_served(worker)
    return worker


def idle_worker(
    config: ServerConfig,
    catalog: ModelCatalog,
    split: Split | None,
    budget: int,
    lockstep: Lockstep | None,
) -> GenerationWorker:
    """The generation thread, started, with MLX's buffer cache bounded; no model yet."""
    disk = None
    if config.prompt_cache_dir is not None:
        disk = DiskCache(config.prompt_cache_dir, int(config.prompt_cache_disk_gb * GB))
    cache = PromptCache(config.prompt_cache_size, config.prompt_cache_bytes, disk)
    limits = ContinuousBatchLimits(
        decode=config.max_concurrent,
        prefill_chunk=config.prefill_chunk,
        kv_bits=config.kv_bits,
        kv_group_size=config.kv_group_size,
        speculation=config.speculation,
        max_draft=config.max_draft,
        mtp=config.mtp,
    )
    capacity = config.max_concurrent + config.max_queue
    models = ResidentSet(catalog, ModelLoader(config, catalog.tokenizer, split))
    worker = GenerationWorker(models, cache, limits, capacity, budget, lockstep=lockstep)
    worker.start()
    worker.call(lambda: _bound_buffer_cache(config, budget))
    return worker


def load_served(worker: GenerationWorker) -> None:
    """Load every served model on the generation thread (a bad one ends the server)."""
    for name, spec in worker.models.catalog.served.items():
        start = time.perf_counter()
        try:
            worker.call(functools.partial(worker.load, spec))
        except ServiceError as e:
            raise SystemExit(f"mlxserve: {name}: {e.message}") from e
        log.info(
            "Serving %r from %s (ready in %.1fs)", name, spec.path, time.perf_counter() - start
        )


def follow(config: ServerConfig, world: World) -> None:
    """A rank other than 0: load this rank's share of the model and replay rank 0's
    generation loop until rank 0 stops (exit 0) or is gone (exit 1). Never returns."""
    register_all()
    paths, budget = _models_and_budget(config)
    cluster = Cluster(world, config, paths, budget)
    assert cluster.link is not None
    # From the first moment: rank 0 starts watching once every rank has loaded, and a
    # heartbeat started only then could come late.
    cluster.link.beat(on_lost=lambda: _leave(1, "Lost the line to rank 0; stopping"))
    catalog = ModelCatalog(config, paths)
    spec = catalog.default
    lockstep = Follower(
        world, cluster.link, spec, catalog.tokenizer(spec), lambda why: _leave(1, why)
    )
    worker = start_worker(config, catalog, cluster.split, cluster.startup.memory_budget, lockstep)
    worker.call(cluster.seed)
    cluster.check_even(worker.call(lambda: worker.residency.accounting(spec)))
    # Ctrl-C reaches every rank the launcher started on this machine: rank 0 stops the
    # group (its last step says so), so the others let it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("Rank %d (pid %d) follows rank 0", world.rank, os.getpid())
    worker.follow()
    worker.wait()
    if lockstep.lost:
        _leave(1, "Rank 0 is gone; stopping")
    _leave(0, "Rank 0 stopped; stopping")


def _leave(status: int, message: str) -> None:
    """Exit now (the generation thread may be blocked in a collective for good)."""
    (log.info if status == 0 else log.error)(message)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _bound_buffer_cache(config: ServerConfig, budget: int) -> None:
    """MLX keeps freed buffers for reuse up to its cache limit (on Metal, as much as the
    device's memory): bound it to a share of the budget unless MLX's own limit is lower."""
    if config.cache_limit_gb is not None:
        limit = int(config.cache_limit_gb * GB)
    else:
        limit = min(int(budget * CACHE_LIMIT_SHARE), mx.set_cache_limit(0))
    mx.set_cache_limit(limit)
    log.info(
        "Memory budget %s; MLX buffer cache limit %s", format_bytes(budget), format_bytes(limit)
    )


def run(config: ServerConfig) -> None:
    world = join_world()
    if world is None and config.distributed is not None:
        log.warning("--distributed has no effect: this process was not started by mlx.launch")
    if world is not None and not world.leader:
        follow(config, world)
    server = build_server(config, world)
    try:  # from here a signal shuts down cleanly, even one right after the ready line
        # SIGTERM (a service manager, `kill`) shuts down like Ctrl-C: the prompt cache is
        # saved. Ctrl-C's own handler is set too: Python leaves SIGINT ignored when the
        # process was started so (a script's background job), and Ctrl-C would not stop it.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        service = server.routes.service
        protected = server.routes.keys.required
        warning = exposure_warning(config.host, protected)
        if warning is not None:
            log.warning(warning)
        server.routes.mcp.start()  # the servers' tools listed before the first request
        print(ready_screen(server.origin, service, protected, warning), flush=True)
        server.routes.batch_keeper.resume()  # batches a restart (or a crash) left running
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        shut_down(server)


def shut_down(server: MLXServer) -> None:
    """Stop taking connections, end every open request (streams get a last error event),
    write the prompt cache's disk tier, then leave at once with status 0: interpreter
    teardown while MLX's threads and the HTTP threads still exist can abort the
    process ("terminate called without an active exception", exit 134)."""
    server.server_close()
    server.routes.batch_keeper.stop()  # lines running now run again after a restart
    server.routes.mcp.stop()
    server.routes.service.worker.stop()
    server.routes.open_sockets.going_away()  # each closes with 1001 once its turn ends
    if not server.drain(DRAIN_SECONDS):
        log.warning("Some requests did not finish their replies within %ds", DRAIN_SECONDS)
    server.routes.open_sockets.wait_closed(SOCKETS_CLOSING_SECONDS)
    log.info("Stopped")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

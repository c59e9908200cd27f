"""Rank 0's line to every other rank: plain TCP beside MLX's collectives.

Rank 0 sends each step of its generation loop down the line; the others send a
heartbeat back every second. Not a collective, for two reasons: publishing a step must not
wait for the device (a collective would queue behind the step in flight), and a rank that
dies or hangs must be noticed where a collective would block. Rank 0 listens on a port of
its own; the address and a secret go to the other ranks in one collective at start
(`world.share`), and a connection that does not show the secret is dropped.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FRAME = struct.Struct("!I")  # each message: its length, then its bytes
HEARTBEAT_SECONDS = 1.0
CONNECT_SECONDS = 60.0  # for every rank to reach rank 0 at start


@dataclass(frozen=True)
class Address:
    """Where the other ranks reach rank 0, and the secret they show."""

    hosts: tuple[str, ...]
    port: int
    secret: str


def rank0_hosts() -> tuple[str, ...]:
    """Rank 0's addresses as the other ranks know them: from what mlx.launch gave every
    rank (the ring's hostfile, the JACCL coordinator), else from its host name."""
    hosts: list[str] = []
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and Path(hostfile).is_file():
        try:
            ring = json.loads(Path(hostfile).read_text() or "[]")
            hosts += [entry.rsplit(":", 1)[0] for entry in ring[0]] if ring else []
        except (ValueError, TypeError, IndexError, AttributeError):
            log.debug("unreadable ring hostfile %s", hostfile)
    for variable in ("MLX_JACCL_COORDINATOR", "NCCL_HOST_IP"):
        if value := os.environ.get(variable):
            hosts.append(value.rsplit(":", 1)[0] if variable.startswith("MLX") else value)
    with contextlib.suppress(OSError):
        hosts += socket.gethostbyname_ex(socket.gethostname())[2]
    return tuple(dict.fromkeys([*hosts, socket.gethostname()]))


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(FRAME.pack(len(payload)) + payload)


def _receive(sock: socket.socket) -> bytes | None:
    """One message; None once the other side closed the line."""
    header = _exactly(sock, FRAME.size)
    if header is None:
        return None
    return _exactly(sock, FRAME.unpack(header)[0])


def _exactly(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(min(count - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class Hub:
    """Rank 0's end: one connection to each other rank."""

    def __init__(self, size: int):
        self._listener = socket.create_server(("", 0))
        self._size = size
        self._secret = secrets.token_hex(16)
        self._links: dict[int, socket.socket] = {}
        self._closing = False

    @property
    def address(self) -> Address:
        return Address(rank0_hosts(), self._listener.getsockname()[1], self._secret)

    def accept(self) -> None:
        """Wait for every other rank to connect and show the secret."""
        self._listener.settimeout(CONNECT_SECONDS)
        while len(self._links) < self._size - 1:
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                missing = sorted(set(range(1, self._size)) - set(self._links))
                raise SystemExit(
                    f"mlxserve: ranks {missing} did not reach rank 0's control port "
                    f"{self.address.port} within {CONNECT_SECONDS:.0f}s"
                ) from None
            sock.settimeout(10)
            try:
                hello = _receive(sock)
                secret, rank = json.loads(hello or b"{}").get("secret"), None
                if hmac.compare_digest(str(secret), self._secret):
                    rank = json.loads(hello or b"{}")["rank"]
            except (OSError, ValueError, KeyError):
                rank = None
            if rank is None:
                log.warning("Dropped a control connection from %s without the secret", peer)
                sock.close()
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._links[rank] = sock
        self._listener.close()

    def send(self, payload: bytes, last: bool = False) -> None:
        """To every other rank (the generation thread; an OSError if a rank is gone).
        After the `last` message the ranks leave: their lines closing is no fault."""
        self._closing = self._closing or last
        for sock in self._links.values():
            _send(sock, payload)

    def watch(self, timeout: float, on_fault: Callable[[str], None]) -> None:
        """Call `on_fault` when a rank closes its line or sends no heartbeat for `timeout`
        seconds (a thread per rank)."""
        for rank, sock in self._links.items():
            threading.Thread(
                target=self._watch, args=(rank, sock, timeout, on_fault), daemon=True
            ).start()

    def _watch(
        self, rank: int, sock: socket.socket, timeout: float, on_fault: Callable[[str], None]
    ) -> None:
        sock.settimeout(timeout)
        try:
            while sock.recv(64):
                pass
            why = "closed its connection (it exited or was killed)"
        except TimeoutError:
            why = f"sent no heartbeat for {timeout:g}s (it hangs or its network is down)"
        except OSError as e:
            why = f"lost its connection ({e})"
        if not self._closing:
            on_fault(f"rank {rank} {why}")


class Link:
    """Another rank's end: receives rank 0's messages, sends heartbeats."""

    def __init__(self, address: Address, rank: int):
        self._sock = self._connect(address)
        _send(self._sock, json.dumps({"secret": address.secret, "rank": rank}).encode())
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @staticmethod
    def _connect(address: Address) -> socket.socket:
        failures = []
        for host in address.hosts:
            try:
                return socket.create_connection((host, address.port), timeout=5)
            except OSError as e:
                failures.append(f"{host}: {e}")
        raise SystemExit(
            f"mlxserve: cannot reach rank 0's control port {address.port} ({'; '.join(failures)})"
        )

    def receive(self) -> bytes | None:
        """The next message from rank 0; None once rank 0 closed the line."""
        self._sock.settimeout(None)
        try:
            return _receive(self._sock)
        except OSError:
            return None

    def beat(self, on_lost: Callable[[], None]) -> None:
        """Send heartbeats from a thread until the line breaks, then call `on_lost`."""

        def run() -> None:
            while True:
                try:
                    self._sock.sendall(b"\0")
                except OSError:
                    on_lost()
                    return
                time.sleep(HEARTBEAT_SECONDS)

        threading.Thread(target=run, name="heartbeat", daemon=True).start()

"""A guarded HTTP GET for image, video and audio URLs: every address a host name
resolves to is checked before connecting (directly and after each redirect, whatever its
notation: a decimal integer, IPv4-mapped IPv6), the connection goes to the address that
was checked (a second DNS answer cannot swap it), and one deadline covers connecting, the
headers and the body, so a server trickling bytes cannot hold a request.

Link-local addresses (169.254.0.0/16, fe80::/10), where cloud metadata services answer,
are always refused; so are unspecified, multicast and reserved ones. Loopback and private
ranges are refused unless the server allows local URLs (--allow-local-image-urls): a
request must not make the server reach what only the server can reach."""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass

MAX_REDIRECTS = 3
READ_BLOCK = 64 * 1024
REDIRECTS = (301, 302, 303, 307, 308)
# Metadata services outside the link-local range (Alibaba Cloud's; AWS's IPv6 one).
METADATA = (ipaddress.ip_address("100.100.100.200"), ipaddress.ip_address("fd00:ec2::254"))

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class FetchError(Exception):
    """Why a URL was not fetched; `refused`: a rule forbade it (no connection was made)."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.refused = refused


class TooLarge(FetchError):
    """The response declared a body over max_bytes."""

    def __init__(self, size: int):
        super().__init__(f"{size} bytes")
        self.size = size


@dataclass(frozen=True)
class FetchRules:
    timeout: float  # for the whole fetch, redirects included
    max_bytes: int  # a larger body stops the read (the caller sees max_bytes + 1)
    allow_local: bool  # loopback and private addresses may be fetched


def fetch(url: str, rules: FetchRules) -> bytes:
    """The body at `url` (up to max_bytes + 1 bytes), following at most MAX_REDIRECTS
    http(s) redirects; FetchError otherwise."""
    deadline = time.monotonic() + rules.timeout
    for _ in range(MAX_REDIRECTS + 1):
        status, location, body = _get(url, rules, deadline)
        if status not in REDIRECTS:
            if status != 200:
                raise FetchError(f"HTTP {status}")
            return body
        if not location:
            raise FetchError(f"HTTP {status} without a Location")
        url = urllib.parse.urljoin(url, location)
    raise FetchError(f"more than {MAX_REDIRECTS} redirects")


def _get(url: str, rules: FetchRules, deadline: float) -> tuple[int, str | None, bytes]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchError(f"a redirect to a {scheme}: URL", refused=True)
    host = parts.hostname
    if not host:
        raise FetchError("the URL names no host", refused=True)
    port = parts.port or (443 if scheme == "https" else 80)
    address = _checked_address(host, port, rules.allow_local)
    connection = _Connection(scheme, host, address, port, _remaining(deadline))
    watchdog = threading.Timer(_remaining(deadline), connection.cut)  # the whole fetch
    watchdog.start()
    try:
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection.request("GET", target, headers={"User-Agent": "mlxserve", "Host": parts.netloc})
        response = connection.getresponse()
        if response.status in REDIRECTS:
            return response.status, response.getheader("Location"), b""
        declared = response.getheader("Content-Length") or ""
        if declared.isdigit() and int(declared) > rules.max_bytes:
            raise TooLarge(int(declared))
        return response.status, None, _read(response, rules.max_bytes + 1, deadline)
    except (OSError, http.client.HTTPException) as e:
        if time.monotonic() >= deadline:
            raise FetchError("it took longer than --image-fetch-timeout") from e
        raise FetchError(str(e) or type(e).__name__) from e
    finally:
        watchdog.cancel()
        connection.close()


def _read(response: http.client.HTTPResponse, most: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < most:
        if time.monotonic() >= deadline:
            raise FetchError("it took longer than --image-fetch-timeout")
        block = response.read1(min(READ_BLOCK, most - len(data)))
        if not block:
            break
        data += block
    return bytes(data)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchError("it took longer than --image-fetch-timeout")
    return left


def _checked_address(host: str, port: int, allow_local: bool) -> IPAddress:
    """The first address `host` resolves to, once every one of them is allowed."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise FetchError(f"its host does not resolve ({e})") from e
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    for address in addresses:
        why = refusal(address, allow_local)
        if why is not None:
            raise FetchError(f"{host} is {address}, {why}", refused=True)
    return addresses[0]


def refusal(address: IPAddress, allow_local: bool) -> str | None:
    """Why the server may not connect to `address`; None when it may."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local or address in METADATA:
        return "a link-local or metadata address, never fetched"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "not an address to fetch from"
    if (address.is_loopback or address.is_private) and not allow_local:
        return "a local address; start the server with --allow-local-image-urls to fetch it"
    return None


class _Connection(http.client.HTTPConnection):
    """HTTP(S) to an address already checked, with the URL's host for Host, SNI and the
    certificate; `cut` ends it from another thread (the fetch's deadline)."""

    def __init__(self, scheme: str, host: str, address: IPAddress, port: int, timeout: float):
        super().__init__(str(address), port, timeout=timeout)
        self._scheme, self._name = scheme, host

    def connect(self) -> None:
        super().connect()
        if self._scheme == "https":
            context = ssl.create_default_context()
            self.sock = context.wrap_socket(self.sock, server_hostname=self._name)

    def cut(self) -> None:
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

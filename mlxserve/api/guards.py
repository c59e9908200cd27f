"""Checks on a request's headers before anything reads its body: whose it may be (Host,
Origin), what it must be (JSON from browsers), and how its body is framed.

Why each exists: a server on localhost is reachable from any web page the user opens.
DNS rebinding points a page's own host name at 127.0.0.1 (the Host header still names
the page); a cross-site form or `text/plain` fetch needs no CORS preflight. Ambiguous
framing (two lengths, a length and chunking, numbers or encodings a lax parser reads
otherwise) is how requests are smuggled past proxies."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

from mlxserve.protocol.errors import ErrorKind, ServiceError, bad_request

# Content types a browser may send cross-origin without asking first (CORS "simple").
FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
# Host names a loopback-bound server answers to by default besides loopback addresses:
# Docker Desktop's name for the host, used by containerised clients (Open WebUI).
LOCAL_NAMES = ("localhost", "host.docker.internal")


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, has_key: bool) -> str | None:
    """What to tell the operator of a server that other machines can reach with no key:
    anyone on the network may use it, its admin endpoints included."""
    if is_loopback(host) or has_key:
        return None
    return (
        f"This server listens on {host} without an API key: anyone who can reach this "
        "machine can use it, load and unload its models included. Give --api-key (or "
        "MLXSERVE_API_KEY), or bind to 127.0.0.1."
    )


def host_allowed(header: str | None, allowed: tuple[str, ...] | None, bound_to: str) -> bool:
    """Whether the Host header names this server. `allowed`: host names, "*" for any, or
    None: loopback names for a server bound to loopback, any name for one bound wider."""
    if allowed is None:
        allowed = () if is_loopback(bound_to) else ("*",)
    if header is None or "*" in allowed:
        return True  # no Host: not a browser (every browser sends one)
    try:
        name = urlsplit(f"//{header}").hostname or ""
    except ValueError:
        return False
    if allowed:
        return name in allowed
    return is_loopback(name) or name in LOCAL_NAMES


def check_host(headers: Message, allowed: tuple[str, ...] | None, bound_to: str) -> None:
    host = headers.get("Host")
    if not host_allowed(host, allowed, bound_to):
        raise ServiceError(
            ErrorKind.FORBIDDEN,
            f"The Host header {host!r} does not name this server; start it with "
            "--allowed-hosts to answer to that name.",
            code="host_not_allowed",
        )


def same_origin(origin: str, host: str | None) -> bool:
    """A page this server served (the web app) posting back to it: its origin is the
    Host it asked for, which check_host has already allowed."""
    return host is not None and origin in (f"http://{host}", f"https://{host}")


def check_origin(headers: Message, allowed_origins: tuple[str, ...]) -> None:
    """A request from a web page (it carries Origin) must come from an allowed origin, or
    be the server's own page: what CORS cannot stop (a simple POST, a WebSocket)."""
    origin = headers.get("Origin")
    if origin is None:
        return  # curl, SDKs, agents: not a browser
    allowed = "*" in allowed_origins or origin in allowed_origins
    if not allowed and not same_origin(origin, headers.get("Host")):
        raise ServiceError(
            ErrorKind.FORBIDDEN,
            f"Requests from the origin {origin!r} are not allowed (see --allowed-origins).",
            code="origin_not_allowed",
        )


def check_browser_post(headers: Message, allowed_origins: tuple[str, ...]) -> None:
    """A POST from a web page must come from an allowed origin and be JSON: form and text
    bodies skip the browser's CORS preflight."""
    if headers.get("Origin") is None:
        return
    check_origin(headers, allowed_origins)
    kind = headers.get_content_type()
    if headers.get("Content-Type") is None or kind in FORM_TYPES:
        raise ServiceError(
            ErrorKind.UNSUPPORTED_MEDIA_TYPE,
            "A request from a web page must be sent as Content-Type: application/json.",
            code="unsupported_media_type",
        )


@dataclass(frozen=True)
class Framing:
    """How the body is delimited: chunked, or `length` bytes (0: no body)."""

    chunked: bool
    length: int


DIGITS = re.compile(r"[0-9]{1,18}")
HEX_DIGITS = re.compile(rb"[0-9A-Fa-f]{1,16}")


def body_framing(headers: Message) -> Framing:
    """The body's framing, or a 400 when the headers are anything but plain: one
    Transfer-Encoding, exactly `chunked`; Content-Length digits only, equal where repeated;
    never both. What a lax parser would take (`xchunked`, `+5`, `0_5`) is how a request is
    smuggled past a proxy that reads it otherwise."""
    encodings = headers.get_all("Transfer-Encoding") or []
    lengths = [v.strip() for h in headers.get_all("Content-Length") or [] for v in h.split(",")]
    if encodings and lengths:
        raise bad_request("A request may not have both Content-Length and Transfer-Encoding.")
    if encodings:
        if len(encodings) > 1 or encodings[0].strip().lower() != "chunked":
            raise bad_request(
                f"Transfer-Encoding {', '.join(encodings)!r} is not supported; only chunked."
            )
        return Framing(True, 0)
    if not all(DIGITS.fullmatch(v) for v in lengths) or len(set(lengths)) > 1:
        raise bad_request("Invalid Content-Length header: one decimal number.")
    return Framing(False, int(lengths[0]) if lengths else 0)


def chunk_size(line: bytes) -> int:
    """A chunk's size line (hex digits, then perhaps `;extensions`), or a 400."""
    digits = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not HEX_DIGITS.fullmatch(digits):
        raise bad_request("Malformed chunked request body: a chunk size is hex digits.")
    return int(digits, 16)

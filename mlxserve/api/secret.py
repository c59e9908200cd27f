"""The server's secret key: it signs thinking blocks and seals reasoning and compactions,
so that what a client sends back as this server's own words is taken as such only when
this server wrote it.

One key per install: made once (32 random bytes) and kept in the cache folder, readable by
its owner only; or given with --secret-key or $MLXSERVE_SECRET_KEY, so that several
servers behind one name accept each other's blobs. The server installs it at start; until
then (a test, a script importing the dialects) a random key of this process stands in."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

KEY_ENV = "MLXSERVE_SECRET_KEY"
KEY_FILE = "secret.key"
KEY_BYTES = 32

_key = secrets.token_bytes(KEY_BYTES)


def current() -> bytes:
    return _key


def matches(expected: str, given: str) -> bool:
    """Whether a client's `given` tag is the `expected` one, in constant time (compared as
    bytes: hmac refuses strings that are not ASCII, which a client may send)."""
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


def install(given: str | None, folder: Path) -> None:
    """Use `given` (any text: it is hashed to a key), else the install's key file in
    `folder`, made now if there is none."""
    global _key
    _key = hashlib.sha256(given.encode()).digest() if given else _key_file(folder / KEY_FILE)


def _key_file(path: Path) -> bytes:
    try:
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
        log.warning("%s is not a key of %d bytes: a new one replaces it", path, KEY_BYTES)
        path.unlink()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    draft = path.with_name(f"{KEY_FILE}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:  # whole or not at all, and only once: two servers starting together agree
        os.link(draft, path)
    except FileExistsError:
        key = path.read_bytes()
    finally:
        draft.unlink()
    log.info("This install's secret key: %s", path)
    return key

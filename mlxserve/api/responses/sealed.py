"""A reasoning item's `encrypted_content`: the reasoning text, sealed so that this server
can take it back as the model's own reasoning when a stateless client (store: false,
Codex) returns it in the next request's input.

It is compressed and authenticated, not secret: the client saw the reasoning anyway. The
tag tells this server's reasoning from anything else (another provider's blob, an edited
one), which is left out of the prompt instead of being taken as the model's thoughts."""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib

_KEY = b"mlxserve reasoning seal v1"
PREFIX = "mlxserve-rs1."


def seal(reasoning: str) -> str:
    body = base64.urlsafe_b64encode(zlib.compress(reasoning.encode("utf-8"))).decode()
    return f"{PREFIX}{body}.{_tag(body)}"


def unseal(blob: str) -> str | None:
    """The reasoning a blob of this server holds; None for any other blob."""
    body, _, tag = blob.removeprefix(PREFIX).rpartition(".")
    if not blob.startswith(PREFIX) or not hmac.compare_digest(_tag(body), tag):
        return None
    try:
        return zlib.decompress(base64.urlsafe_b64decode(body)).decode("utf-8")
    except (ValueError, zlib.error):
        return None


def _tag(body: str) -> str:
    digest = hmac.new(_KEY, body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode()

"""`encrypted_content` blobs: text this server wrote, sealed so that it can take it back
when a stateless client (store: false, Codex) returns it in a later request's input. Two
kinds: a reasoning item's reasoning, and a compaction item's summary of the turns it
stands for.

A blob is compressed and authenticated, not secret: the client saw the text anyway. The
tag, over the kind's prefix and the body, tells this server's blob of that kind from
anything else (another provider's blob, an edited one, a blob of the other kind), which
is left out of the prompt instead of being taken as the model's own words."""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from dataclasses import dataclass

_KEY = b"mlxserve reasoning seal v1"


@dataclass(frozen=True)
class Seal:
    prefix: str

    def seal(self, text: str) -> str:
        body = base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"))).decode()
        return f"{self.prefix}{body}.{self._tag(body)}"

    def unseal(self, blob: str) -> str | None:
        """The text a blob of this kind holds; None for any other blob."""
        body, _, tag = blob.removeprefix(self.prefix).rpartition(".")
        if not blob.startswith(self.prefix) or not hmac.compare_digest(self._tag(body), tag):
            return None
        try:
            return zlib.decompress(base64.urlsafe_b64decode(body)).decode("utf-8")
        except (ValueError, zlib.error):
            return None

    def _tag(self, body: str) -> str:
        signed = f"{self.prefix}{body}".encode()
        digest = hmac.new(_KEY, signed, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:18]).decode()


REASONING = Seal("mlxserve-rs1.")
COMPACTION = Seal("mlxserve-cmp1.")

"""Sealed blobs: text this server wrote, handed to a client so that the server can take it
back when the client returns it in a later request. The Responses API's `encrypted_content`
(reasoning, compaction summaries) and the signatures of Anthropic thinking blocks whose
text is omitted from the reply are such blobs.

A blob is compressed and authenticated, not secret: the client could have had the text
anyway. The tag, keyed with the install's secret (api/secret.py) over the kind's prefix and
the body, tells this server's blob of that kind from anything else (another provider's
blob, an edited or minted one, a blob of another kind), which is left out of the prompt
instead of being taken as the model's own words. The tag is checked before anything is
inflated, and inflating stops at UNSEALED_LIMIT: a blob holding more is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from dataclasses import dataclass

from mlxserve.api import secret
from mlxserve.protocol.errors import bad_request

# More text than any context holds (a million tokens of 8 bytes): a blob inflating past it
# was made to exhaust memory, not by a model.
UNSEALED_LIMIT = 8 * 1024 * 1024


@dataclass(frozen=True)
class Seal:
    prefix: str
    holder: str  # what a client returns the blob in, for the error that refuses one

    def seal(self, text: str) -> str:
        body = base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"))).decode()
        return f"{self.prefix}{body}.{self._tag(body)}"

    def unseal(self, blob: str, param: str) -> str | None:
        """The text a blob of this kind holds; None for any other blob; a 400 naming
        `param` for one of ours that inflates past UNSEALED_LIMIT."""
        body, _, tag = blob.removeprefix(self.prefix).rpartition(".")
        if not blob.startswith(self.prefix) or not secret.matches(self._tag(body), tag):
            return None
        inflater = zlib.decompressobj()
        try:
            text = inflater.decompress(base64.urlsafe_b64decode(body), UNSEALED_LIMIT)
        except (ValueError, zlib.error):
            return None
        if inflater.unconsumed_tail:
            raise bad_request(f"This {self.holder} holds more than {UNSEALED_LIMIT} bytes.", param)
        return text.decode("utf-8", errors="replace")

    def _tag(self, body: str) -> str:
        signed = f"{self.prefix}{body}".encode()
        digest = hmac.new(secret.current(), signed, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:18]).decode()

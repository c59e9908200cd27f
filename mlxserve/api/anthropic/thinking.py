"""Signatures of thinking blocks: the server recognises its own reasoning when a client
sends it back in the history.

A signature is a hash of the thinking text keyed with the install's secret (api/secret.py):
it tells this server's reasoning, which goes back to the model as
its reasoning, from anything else (another provider's thinking, an edited block), which
is left out of the prompt, as Anthropic leaves out thinking it cannot verify.

A block whose text the reply omits (`thinking.display: "omitted"`) has an empty `thinking`
and a signature that holds the reasoning itself, sealed (api/seal.py), as Anthropic's
signature of such a block carries its reasoning: sent back, the block is the reasoning it
holds."""

from __future__ import annotations

import base64
import hashlib
import hmac

from mlxserve.api import secret
from mlxserve.api.seal import Seal

PREFIX = "mlxserve-v1."
OMITTED = Seal("mlxserve-th1.", "signature")


def sign(thinking: str) -> str:
    signed = ("thinking\n" + thinking).encode("utf-8")  # apart from the sealed blobs' tags
    digest = hmac.new(secret.current(), signed, hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def signature(thinking: str, omitted: bool) -> str:
    """A block's signature: its text's, or, for a block whose text is omitted, the text."""
    return OMITTED.seal(thinking) if omitted else sign(thinking)


def verify(thinking: str, signature: str | None) -> bool:
    return signature is not None and secret.matches(sign(thinking), signature)


def reasoning(thinking: str, signature: str | None, param: str) -> str | None:
    """The reasoning a thinking block sent back stands for: its text under this server's
    signature, the text a sealed signature holds, or None (not this server's)."""
    if verify(thinking, signature):
        return thinking
    return OMITTED.unseal(signature, f"{param}.signature") if signature else None

"""Signatures of thinking blocks: the server recognises its own reasoning when a client
sends it back in the history.

A signature is a hash of the thinking text keyed with the install's secret (api/secret.py):
it tells this server's reasoning, which goes back to the model as
its reasoning, from anything else (another provider's thinking, an edited block), which
is left out of the prompt, as Anthropic leaves out thinking it cannot verify."""

from __future__ import annotations

import base64
import hashlib
import hmac

from mlxserve.api import secret

PREFIX = "mlxserve-v1."


def sign(thinking: str) -> str:
    signed = ("thinking\n" + thinking).encode("utf-8")  # apart from the sealed blobs' tags
    digest = hmac.new(secret.current(), signed, hashlib.sha256).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def verify(thinking: str, signature: str | None) -> bool:
    return signature is not None and secret.matches(sign(thinking), signature)

"""What a key is: its name and limits (`KeyRecord`), how a secret is made and matched."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

# A key's name goes into metric labels, log lines and the usage table: short and plain.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SECRET_PREFIX = "mlxs-"
# The longest secret worth hashing: anything longer is no key of ours.
MAX_SECRET_CHARS = 256
# The name `--api-key` answers to: one admin key outside the store.
API_KEY_NAME = "api-key"


@dataclass(frozen=True)
class KeyRecord:
    name: str
    hint: str  # the secret's first characters, to tell keys apart in `keys list`
    models: tuple[str, ...] | None  # None: every served model
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    tokens_per_day: int | None = None  # per UTC day
    max_concurrent: int | None = None  # requests in flight at once
    admin: bool = False
    expires_at: int | None = None  # unix seconds
    created_at: int = 0
    revoked_at: int | None = None

    def usable(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """What the store keeps of a secret. Secrets are 256 random bits, so a plain hash
    cannot be reversed by guessing."""
    return hashlib.sha256(secret.encode()).hexdigest()


def valid_name(name: str) -> bool:
    return NAME.fullmatch(name) is not None and name != API_KEY_NAME

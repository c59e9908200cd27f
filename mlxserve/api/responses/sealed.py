"""`encrypted_content` blobs (api/seal.py): text this server wrote, sealed so that it can
take it back when a stateless client (store: false, Codex) returns it in a later request's
input. Two kinds: a reasoning item's reasoning, and a compaction item's summary of the
turns it stands for. A blob of one kind is not taken for the other."""

from __future__ import annotations

from mlxserve.api.seal import UNSEALED_LIMIT, Seal

__all__ = ["COMPACTION", "REASONING", "UNSEALED_LIMIT"]

REASONING = Seal("mlxserve-rs1.", "encrypted_content")
COMPACTION = Seal("mlxserve-cmp1.", "encrypted_content")

"""Whose records (files, batches, stored responses, conversations) a caller sees: its own
key's; an admin key (or a server without keys) sees everyone's. Another key's are answered
as not found."""

from __future__ import annotations

from mlxserve.batches.store import EVERYONE, Owner
from mlxserve.keys.caller import current_caller


def new_owner() -> str | None:
    """What a record made now is owned by: the caller's key name."""
    return current_caller().name


def scope() -> Owner:
    """Whose records a list shows."""
    caller = current_caller()
    return EVERYONE if caller.admin else caller.name


def visible(owner: str | None) -> bool:
    caller = current_caller()
    return caller.admin or owner == caller.name

"""GET /v1/usage (what a key used, by day and model) and GET /v1/keys (the keys, for an
admin): the key store as JSON."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from urllib.parse import parse_qs

from mlxserve.keys.caller import Caller, admin_only
from mlxserve.keys.gate import KeyGate
from mlxserve.keys.records import KeyRecord
from mlxserve.keys.store import UsageRow
from mlxserve.protocol.errors import bad_request
from mlxserve.telemetry.record import Metered

DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass
class UsageEndpoints:
    gate: KeyGate

    def usage(self, query: str, caller: Caller) -> dict:
        """`?start=YYYY-MM-DD&end=YYYY-MM-DD` (UTC days, both included) and, for an admin,
        `key=NAME`; a key that is not an admin's sees its own usage only."""
        asked = {name: values[-1] for name, values in parse_qs(query).items()}
        start, end = (_day(asked.get(name), name) for name in ("start", "end"))
        key = asked.get("key")
        if not caller.admin:
            if key is not None and key != caller.name:
                raise admin_only()
            key = caller.name
        rows = self.gate.usage(key, start, end)
        total = sum((row.metered for row in rows), Metered())
        return {"object": "list", "data": [_row(row) for row in rows], "total": asdict(total)}

    def keys(self) -> dict:
        return {"object": "list", "data": [_key_entry(key) for key in self.gate.all_keys()]}


def _key_entry(key: KeyRecord) -> dict:
    """A key as listed: its name, limits and dates (never its secret or hash)."""
    entry = asdict(key)
    entry["models"] = list(key.models) if key.models is not None else None
    return {"object": "api_key", **entry}


def _row(row: UsageRow) -> dict:
    return {"key": row.key, "model": row.model, "date": row.day, **asdict(row.metered)}


def _day(value: str | None, name: str) -> str | None:
    if value is None or DAY.fullmatch(value):
        return value
    raise bad_request(f"{name} must be a UTC date, YYYY-MM-DD.", param=name)

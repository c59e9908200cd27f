"""`mlxserve keys create|list|revoke|usage`: the key store from the shell. A running
server sees a change within a second. `create` prints the new secret alone on stdout (it
is shown once: only its hash is kept), so a script can capture it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from mlxserve.keys.records import KeyRecord, valid_name
from mlxserve.keys.store import UNITS, KeyExists, KeyStore, keys_path


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {value}")
    return number


def _date(value: str) -> int:
    """A date (YYYY-MM-DD: the key stops at its start, timezone.utc) or an ISO time."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a date or ISO time: {value}") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp())


def _models(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one model")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxserve keys", description="Manage API keys.")
    p.add_argument(
        "--keys-db", type=Path, help="the key store (default: keys.sqlite in the cache folder)"
    )
    commands = p.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="make a key and print it (once)")
    create.add_argument("name")
    create.add_argument("--models", type=_models, help="comma-separated model ids (default: all)")
    create.add_argument("--rpm", type=_positive, help="requests per minute")
    create.add_argument("--tpm", type=_positive, help="tokens (prompt + completion) per minute")
    create.add_argument("--tokens-per-day", type=_positive, help="tokens per UTC day")
    create.add_argument("--max-concurrent", type=_positive, help="requests in flight at once")
    create.add_argument("--admin", action="store_true", help="may load models, see all usage")
    create.add_argument("--expires", type=_date, help="YYYY-MM-DD (timezone.utc) or an ISO time")
    commands.add_parser("list", help="every key with its limits")
    revoke = commands.add_parser("revoke", help="stop a key working (within a second)")
    revoke.add_argument("name")
    usage = commands.add_parser("usage", help="use by day and model")
    usage.add_argument("name", nargs="?", help="one key (default: every key)")
    usage.add_argument("--start", help="first day, YYYY-MM-DD")
    usage.add_argument("--end", help="last day, YYYY-MM-DD")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    store = KeyStore(keys_path(args.keys_db))
    try:
        return COMMANDS[args.command](store, args)
    finally:
        store.close()


def _create(store: KeyStore, args: argparse.Namespace) -> int:
    if not valid_name(args.name):
        print(
            f"error: {args.name!r} is not a key name: up to 64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit ('api-key' is --api-key's)",
            file=sys.stderr,
        )
        return 2
    record = KeyRecord(
        args.name,
        "",
        args.models,
        args.rpm,
        args.tpm,
        args.tokens_per_day,
        args.max_concurrent,
        args.admin,
        args.expires,
    )
    try:
        secret = store.create(record)
    except KeyExists as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Created the key {args.name!r} in {store.path}; it is shown only now:", file=sys.stderr)
    print(secret)
    return 0


def _list(store: KeyStore, args: argparse.Namespace) -> int:
    rows = [
        (
            key.name,
            key.hint + "…",
            ",".join(key.models) if key.models is not None else "*",
            *(_limit(value) for value in (key.rpm, key.tpm, key.tokens_per_day)),
            _limit(key.max_concurrent),
            "yes" if key.admin else "",
            _state(key),
        )
        for key in store.all_keys()
    ]
    header = ("NAME", "KEY", "MODELS", "RPM", "TPM", "TOKENS/DAY", "CONCURRENT", "ADMIN", "STATE")
    _table(header, rows)
    return 0


def _revoke(store: KeyStore, args: argparse.Namespace) -> int:
    if store.revoke(args.name):
        print(f"Revoked the key {args.name!r}.", file=sys.stderr)
        return 0
    print(f"error: no usable key named {args.name!r}", file=sys.stderr)
    return 1


def _usage(store: KeyStore, args: argparse.Namespace) -> int:
    rows = [
        (row.day, row.key, row.model or "-", *map(_number, asdict(row.metered).values()))
        for row in store.usage(args.name, args.start, args.end)
    ]
    header = ("DAY", "KEY", "MODEL", *(unit.upper() for unit in UNITS))
    _table(header, rows)
    return 0


COMMANDS = {"create": _create, "list": _list, "revoke": _revoke, "usage": _usage}


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _state(key: KeyRecord) -> str:
    if key.revoked_at is not None:
        return "revoked " + _when(key.revoked_at)
    if key.expires_at is not None:
        expired = not key.usable(datetime.now(timezone.utc).timestamp())
        return ("expired " if expired else "expires ") + _when(key.expires_at)
    return "active"


def _when(at: int) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]
    for row in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())

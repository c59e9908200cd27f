"""Who may ask what: the key a request carries is admitted by the key gate (401, 429),
admin endpoints want an admin key (403), and what the request costs is charged to the
key as it is known, so that usage is on disk before the reply reports it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message

from mlxserve.api.websocket import subprotocol_key
from mlxserve.keys.caller import Caller, admin_only, calling
from mlxserve.keys.gate import KeyGate
from mlxserve.telemetry.metrics import Metrics
from mlxserve.telemetry.record import Metered, RequestRecord

# A message of a WebSocket session, as its record names its method: a request that spends.
WEBSOCKET_METHOD = "WS"
SPENDING_METHODS = ("POST", WEBSOCKET_METHOD)


def given_key(headers: Message) -> str | None:
    """`Authorization: Bearer KEY` (OpenAI's clients), `X-API-Key: KEY` (Anthropic's), or
    a browser's WebSocket subprotocol `openai-insecure-api-key.KEY`."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:]
    return headers.get("X-API-Key") or subprotocol_key(headers)


@contextmanager
def admitted(
    gate: KeyGate, headers: Message, admin: bool, record: RequestRecord, metrics: Metrics
) -> Iterator[Caller]:
    """The request's caller for the block (its RequestContext's, and the records it
    owns, api/batches/owners.py), its costs charged to its key (a POST or a WebSocket
    message may spend tokens: the other methods read); `admin`: the route wants an admin
    key."""
    spends = record.method in SPENDING_METHODS
    with gate.admit(given_key(headers), spends) as caller, calling(caller):
        if admin and not caller.admin:
            raise admin_only()
        key = record.key = caller.name
        if key is not None:

            def charge(cost: Metered) -> None:
                model = record.model or ""
                gate.charge(key, model, cost)
                metrics.meter(key, model, cost)

            record.on_metered = charge
        yield caller


def count_request(record: RequestRecord) -> None:
    """A request answered for a model that had no cost of its own (a tokenize call, a
    model's details) still counts as a request."""
    if record.model is not None and not record.metered.requests and (record.status or 0) < 400:
        record.meter(Metered())

"""The request a call into the core serves, passed with the call: who asks (the key's
caller, which models it may use), the request's record (the model it named, what it
cost), whether its client has gone (its work stops) and whether it is batch work (idle
priority). The edge makes one per request (a batch line's, a WebSocket message's too);
the core reads nothing of a request from anywhere else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mlxserve.keys.caller import OPEN, Caller
from mlxserve.telemetry.record import Metered, RequestRecord


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RequestContext:
    caller: Caller = OPEN  # an open server's: every model, no accounting
    record: RequestRecord | None = None  # None: nothing is recorded or charged
    client_gone: Callable[[], bool] = field(default=_never)
    idle_priority: bool = False  # batch work: gives way to interactive requests

    def meter(self, cost: Metered) -> None:
        """Charge `cost` to the request (and through its record, to its key)."""
        if self.record is not None:
            self.record.meter(cost)

"""A WebSocket connection's memory of its last response (OpenAI's WebSocket mode keeps it
per connection): the next turn may continue it with `previous_response_id` and only its new
input, even when nothing was stored (`store: false`)."""

from __future__ import annotations

from dataclasses import dataclass, field

# A response a next turn may continue; a failed one is not (its chain is broken).
CONTINUABLE = ("completed", "incomplete")


@dataclass
class LastResponse:
    id: str | None = None
    items: list[dict] = field(default_factory=list)  # the conversation up to it, its own included

    def history(self, response_id: str) -> list[dict] | None:
        """The conversation a turn continuing `response_id` follows; None if this is
        not the connection's last response."""
        return list(self.items) if response_id == self.id else None

    def remember(self, response: dict, before_output: list[dict]) -> None:
        """`before_output`: the items the response answered (its history and input)."""
        if response.get("status") in CONTINUABLE:
            self.id = response["id"]
            self.items = [*before_output, *response["output"]]

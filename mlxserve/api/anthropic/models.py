"""Anthropic's Models API: GET /v1/models and /v1/models/{model_id} in its shape, for a
request that carries `anthropic-version` (as the `anthropic` SDK's models.list() and
models.retrieve() do). The facts are the model list's (ids, aliases, which names the
caller's key may use: the service and the OpenAI endpoints work them out); this only
renders them, and pages the list as Anthropic's cursors ask."""

from __future__ import annotations

from datetime import datetime, timezone
from email.message import Message

from mlxserve.api.batches.query import Query
from mlxserve.models.kinds import KINDS
from mlxserve.protocol.errors import bad_request, not_found

VERSION_HEADER = "anthropic-version"
DEFAULT_LIMIT, MOST = 20, 1000  # a page's models: Anthropic's default and its bound
LIFECYCLES = ("active", "deprecated", "retired")
LISTED_LIFECYCLES = ("active", "deprecated")  # what a list without `lifecycle` shows
LIFECYCLE = "active"  # every model served here: none is deprecated or retired


def speaks_anthropic(headers: Message) -> bool:
    """Whether a request to the model list is Anthropic's: it names the API version."""
    return headers.get(VERSION_HEADER) is not None


def model_info(entry: dict) -> dict:
    """A model list entry as Anthropic's ModelInfo. Its name is its display name; its
    release date is the list's `created` (the epoch: unknown, as Anthropic allows); its
    context bounds both the input and max_tokens (a longer answer is cut where the context
    ends). A model the Messages API does not serve (an embedding model...) is a 404."""
    model_id = entry["id"]
    if not _serves_messages(entry):
        kind = entry["kind"]
        message = f"The model '{model_id}' ({kind}) is not one the Messages API serves."
        raise not_found(message, param="model", code="model_not_found")
    context = entry.get("context_length")
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": _rfc3339(entry["created"]),
        "max_input_tokens": context,
        "max_tokens": context,
        "lifecycle": LIFECYCLE,
    }


def model_page(entries: list[dict], query: str) -> dict:
    """One page of the models the Messages API serves, in the list's order: `limit` of
    them (1 to 1000, 20 if not given) after `after_id`, or before `before_id`, of the
    lifecycle stages asked for. `has_more`: more in the direction paged."""
    values = Query(query)
    limit = values.limit(DEFAULT_LIMIT, MOST)
    after, before = values.text("after_id"), values.text("before_id")
    if after is not None and before is not None:
        raise bad_request("Give after_id or before_id, not both.", param="before_id")
    shown = LISTED_LIFECYCLES if (asked := _lifecycles(values)) is None else asked
    models = [model_info(e) for e in entries if _serves_messages(e)]
    models = models if LIFECYCLE in shown else []
    if before is not None:
        end = _position(models, before, "before_id")
        start = max(0, end - limit)
        page, more = models[start:end], start > 0
    else:
        start = 0 if after is None else _position(models, after, "after_id") + 1
        page, more = models[start : start + limit], start + limit < len(models)
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def _serves_messages(entry: dict) -> bool:
    """A model whose requests the Messages API takes: a generative one, or an adapter
    (adapters run on one)."""
    kind = entry["kind"]
    return kind == "adapter" or KINDS.named(kind).generative


def _lifecycles(values: Query) -> tuple[str, ...] | None:
    """The `lifecycle` filter (repeated, or as the SDK sends it, `lifecycle[]`), checked;
    None when not given."""
    asked = values.all("lifecycle")
    for value in asked:
        if value not in LIFECYCLES:
            raise bad_request(f"lifecycle must be one of {', '.join(LIFECYCLES)}.", "lifecycle")
    return tuple(asked) or None


def _position(models: list[dict], model_id: str, param: str) -> int:
    for i, model in enumerate(models):
        if model["id"] == model_id:
            return i
    raise bad_request(f"{param}: no model '{model_id}' in the list.", param)


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

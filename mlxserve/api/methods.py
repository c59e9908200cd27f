"""Which endpoint answers a method on a path with ids in it (the batch and conversation
routers): a 405 for a method the path does not take, a 404 for a path none takes."""

from __future__ import annotations

from collections.abc import Callable

from mlxserve.api.responder import RawReply
from mlxserve.protocol.errors import ErrorKind, ServiceError, not_found

Reply = dict | RawReply


def answer_with(method: str, path: str, routes: dict[str, Callable[[], Reply]]) -> Reply:
    """Call the route for `method` among the path's `routes` (method -> call)."""
    route = routes.get(method)
    if route is None:
        if not routes:
            raise not_found(f"Unknown path: {path}", code="unknown_url")
        raise ServiceError(
            ErrorKind.METHOD_NOT_ALLOWED,
            f"Method {method} is not allowed on {path}.",
            code="method_not_allowed",
        )
    return route()

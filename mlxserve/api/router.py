"""The one route table, served: which route answers a method on a path (a 404 for a path
no route has, a 405 for a method its routes do not take), the shape its errors go out
in, and the label its request is counted under."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, TypeVar
from urllib.parse import unquote

from mlxserve.api.errors import ErrorRenderer
from mlxserve.api.responder import Responder
from mlxserve.api.table import Call, Errors, Reply, Route, SocketRoute
from mlxserve.protocol.errors import ErrorKind, ServiceError, not_found

E = TypeVar("E")
OTHER = "other"  # the metrics label of a path no route has (labels stay bounded)


@dataclass(frozen=True)
class Mounted:
    """A route bound to the endpoints object that answers it."""

    route: Route[Any]
    endpoints: Any

    def answer(self, call: Call) -> Reply:
        return self.route.handler(self.endpoints, call)


@dataclass(frozen=True)
class Pattern:
    """One spelling of a route's path, split into segments."""

    segments: tuple[str, ...]

    @classmethod
    def of(cls, path: str) -> Pattern:
        return cls(tuple(path.strip("/").split("/")))

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path's parameters if `parts` (a path's segments) is one of this pattern."""
        params: dict[str, str] = {}
        for index, segment in enumerate(self.segments):
            if segment.endswith(":path}"):  # the rest, slashes and all (an absolute path's)
                rest = "/".join(parts[index:])
                if not rest:
                    return None
                params[segment[1:].removesuffix(":path}")] = unquote(rest)
                return params
            if index >= len(parts):
                return None
            if segment.startswith("{"):
                if not parts[index]:
                    return None
                params[segment[1:-1]] = unquote(parts[index])
            elif segment != parts[index]:
                return None
        return params if len(parts) == len(self.segments) else None

    def shared(self, parts: list[str]) -> int:
        """How many leading literal segments a path has in common with this pattern."""
        count = 0
        for segment, part in zip(self.segments, parts, strict=False):
            if segment.startswith("{") or segment != part:
                break
            count += 1
        return count


@dataclass(frozen=True)
class Found:
    """What answers a request: its route and the path's parameters."""

    mounted: Mounted
    params: dict[str, str]

    @property
    def route(self) -> Route[Any]:
        return self.mounted.route


@dataclass
class Router:
    default_errors: Errors  # where no route's shape is nearer
    mounted: list[Mounted] = field(default_factory=list)
    sockets: dict[str, tuple[SocketRoute[Any], Any]] = field(default_factory=dict)
    _patterns: list[tuple[Pattern, Mounted]] = field(default_factory=list)

    def mount(self, endpoints: E, routes: Iterable[Route[E]]) -> None:
        for route in routes:
            mounted = Mounted(route, endpoints)
            self.mounted.append(mounted)
            self._patterns += [(Pattern.of(path), mounted) for path in route.spellings]

    def mount_sockets(self, endpoints: E, routes: Iterable[SocketRoute[E]]) -> None:
        for route in routes:
            self.sockets.update({path: (route, endpoints) for path in route.spellings})

    @property
    def routes(self) -> list[Route[Any]]:
        return [mounted.route for mounted in self.mounted]

    def find(self, path: str) -> list[Found]:
        """Every route on the path, whatever its method: literal paths first (/v1/models/load
        before /v1/models/{model:path})."""
        parts = path.strip("/").split("/")
        found = [
            Found(mounted, params)
            for pattern, mounted in self._patterns
            if (params := pattern.match(parts)) is not None
        ]
        return sorted(found, key=lambda f: bool(f.params))

    def resolve(self, method: str, path: str) -> Found:
        """The route answering `method` on `path`; a 404 or a 405 as a ServiceError."""
        found = self.find(path)
        for candidate in found:
            route = candidate.route
            if route.method == method or (
                method == "HEAD" and route.method == "GET" and route.head
            ):
                return candidate
        if method == "GET" and path in self.sockets:
            post = " POST creates a response." if found else ""
            raise ServiceError(
                ErrorKind.METHOD_NOT_ALLOWED,
                f"GET {path} opens a WebSocket (send Upgrade: websocket).{post}",
                code="method_not_allowed",
            )
        if found:
            raise ServiceError(
                ErrorKind.METHOD_NOT_ALLOWED,
                f"Method {method} is not allowed on {path}.",
                code="method_not_allowed",
            )
        raise not_found(f"Unknown path: {path}", code="unknown_url")

    def errors(self, method: str, path: str, headers: Message | None = None) -> ErrorRenderer:
        """The error shape of a request: its route's (the one of its method first); for a
        path no route has, that of the routes nearest it (Ollama's under /api/) where they
        agree; else the default."""
        found = sorted(self.find(path), key=lambda f: f.route.method != method)
        if found:
            return found[0].route.errors.renderer(headers)
        parts = path.strip("/").split("/")
        shared = [(pattern.shared(parts), mounted) for pattern, mounted in self._patterns]
        most = max((count for count, _ in shared), default=0)
        nearest = {id(m.route.errors): m.route.errors for count, m in shared if count == most}
        if most and len(nearest) == 1:
            return next(iter(nearest.values())).renderer(headers)
        return self.default_errors.renderer(headers)

    def label(self, path: str) -> str:
        """The path as a metrics label: its route's documented path, or "other"."""
        found = self.find(path)
        return found[0].route.path if found else OTHER

    def endpoint(self, path: str) -> Callable[[bytes, Responder], Reply]:
        """The POST endpoint of a path as a function of a body (a batch's lines run
        through it)."""
        found = self.resolve("POST", path)

        def answer(body: bytes, responder: Responder) -> Reply:
            call = Call({}, "", Message(), responder, lambda: body)
            return found.mounted.answer(call)

        return answer

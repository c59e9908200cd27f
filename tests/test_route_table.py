"""The route table: a route declared once is served, guarded and documented by construction.

A route only this test has is mounted beside the OpenAPI route on a router, behind the
server's own HTTP handler and key gate (a real socket, real HTTP): it is answered, it shows
up in /openapi.json, its admin flag is enforced with a 403 for a key that is not an
admin's, and its errors come in its dialect's shape. Nothing else is touched to get there."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import BaseModel

from mlxserve.api.handler import APIHandler
from mlxserve.api.ollama.errors import ERRORS as OLLAMA_ERRORS
from mlxserve.api.openai.errors import ERRORS as OPENAI_ERRORS
from mlxserve.api.openapi import document as openapi
from mlxserve.api.openapi import shapes as s
from mlxserve.api.router import Router
from mlxserve.api.table import Call, Route
from mlxserve.api.websocket import OpenSockets
from mlxserve.config import ServerConfig
from mlxserve.keys.gate import KeyGate
from mlxserve.keys.store import KeyRecord, KeyStore
from mlxserve.telemetry.activity import Activity
from mlxserve.telemetry.metrics import Metrics


class Greeting(BaseModel):
    name: str


@dataclass
class Greeter:
    greeted: list[str] = field(default_factory=list)

    def greet(self, call: Call) -> dict:
        name = Greeting.model_validate_json(call.body).name
        self.greeted.append(name)
        return {"hello": name, "lang": call.params["lang"]}


ROUTES: tuple[Route[Greeter], ...] = (
    Route("POST", "/v1/greetings/{lang}", lambda g, call: g.greet(call), "Greet someone", "test", {"application/json": s.OBJECT}, OPENAI_ERRORS, Greeting, admin=True),
    Route("GET", "/api/hello", lambda g, call: {"greeted": g.greeted}, "Who was greeted", "test", {"application/json": s.OBJECT}, OLLAMA_ERRORS),
)  # fmt: skip


@dataclass
class Edge:
    router: Router
    keys: KeyGate
    activity: Activity = field(default_factory=Activity)
    open_sockets: OpenSockets = field(default_factory=OpenSockets)
    metrics: Metrics = field(default_factory=Metrics)


class TableServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, config: ServerConfig, routes: Edge):
        super().__init__(("127.0.0.1", 0), APIHandler)
        self.config = config
        self.routes = routes

    def answering(self) -> AbstractContextManager[None]:
        return nullcontext()


@dataclass
class Served:
    port: int
    admin: str
    user: str

    def ask(self, method: str, path: str, key: str | None, body: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        reply = conn.getresponse()
        data = reply.read()
        conn.close()
        return reply.status, json.loads(data) if data else None


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    store = KeyStore(tmp_path / "keys.sqlite")
    admin = store.create(KeyRecord("boss", "", None, admin=True))
    user = store.create(KeyRecord("someone", "", None))
    store.close()
    router = Router(OPENAI_ERRORS)
    router.mount(Greeter(), ROUTES)
    router.mount(openapi.OpenApi(router), openapi.ROUTES)
    gate = KeyGate(tmp_path / "keys.sqlite", None, True)
    server = TableServer(ServerConfig(models=()), Edge(router, gate))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Served(server.server_address[1], admin, user)
    finally:
        server.shutdown()
        server.server_close()
        gate.close()


def test_a_route_is_served_documented_and_guarded(served):
    status, document = served.ask("GET", "/openapi.json", None)  # keyless by its route
    assert status == 200
    operation = document["paths"]["/v1/greetings/{lang}"]["post"]
    assert operation["summary"] == "Greet someone (an admin key)"
    assert operation["parameters"] == [
        {"name": "lang", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert document["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]["required"] == ["name"]
    assert "get" in document["paths"]["/api/hello"]
    assert set(document["paths"]) == {"/v1/greetings/{lang}", "/api/hello", "/openapi.json"}

    # the gate: no key, a key that is not an admin's, an admin's
    assert served.ask("POST", "/v1/greetings/fr", None, {"name": "Ada"})[0] == 401
    status, error = served.ask("POST", "/v1/greetings/fr", served.user, {"name": "Ada"})
    assert status == 403 and error["error"]["type"] == "permission_error"
    status, reply = served.ask("POST", "/greetings/fr", served.admin, {"name": "Ada"})
    assert (status, reply) == (200, {"hello": "Ada", "lang": "fr"})  # without /v1 too
    assert served.ask("GET", "/api/hello", served.user) == (200, {"greeted": ["Ada"]})


def test_misses_are_404_and_405_in_the_nearest_routes_shape(served):
    status, error = served.ask("GET", "/v1/greetings/fr", served.admin)
    assert status == 405 and error["error"]["code"] == "method_not_allowed"
    status, error = served.ask("GET", "/api/nothing", served.admin)
    assert status == 404 and isinstance(error["error"], str)  # Ollama's shape, by its prefix
    status, error = served.ask("GET", "/v1/nothing", served.admin)
    assert status == 404 and error["error"]["code"] == "unknown_url"
    assert served.ask("GET", "/v1/nothing", None)[0] == 401  # no map of paths without a key

"""GET /openapi.json: an OpenAPI 3.1 document of every route the server answers, built
from the route table itself (so a route that exists is documented by construction).

Request bodies are the JSON Schemas of the very pydantic models the endpoints parse with
(so a field added to a wire model is documented by that change); replies and errors are
the shapes in `shapes`. Every path is documented once, with /v1 where it has it: the same
path without /v1 answers too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from mlxserve import __version__
from mlxserve.api.openai.errors import ERRORS
from mlxserve.api.openapi import shapes as s
from mlxserve.api.openapi.shapes import JSON
from mlxserve.api.router import Router
from mlxserve.api.table import Route


@dataclass
class OpenApi:
    """The document of a router's routes (built once: it is the same for every request)."""

    router: Router

    @cached_property
    def body(self) -> dict[str, Any]:
        return document(self.router.routes)


ROUTES: tuple[Route[OpenApi], ...] = (
    Route("GET", "/openapi.json", lambda openapi, call: openapi.body, "This document (no key needed)", "server", {JSON: s.OPENAPI}, ERRORS, keyless=True),
)  # fmt: skip


def document(routes: Sequence[Route[Any]]) -> dict[str, Any]:
    """The OpenAPI document of these routes."""
    models = sorted({model for route in routes for model in route.models}, key=_name)
    refs, defs = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    bodies = {model: refs[(model, "validation")] for model in models}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = route.path.replace(":path}", "}")
        paths.setdefault(path, {})[route.method.lower()] = _operation(route, path, bodies)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mlxserve",
            "version": __version__,
            "description": (
                "An inference server for MLX models. Every path also answers without its "
                "/v1 prefix. Errors come in the shape of the dialect a path belongs to."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {**defs.get("$defs", {}), **s.COMPONENTS},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


def _name(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _operation(op: Route[Any], path: str, bodies: dict) -> dict[str, Any]:
    errors = op.errors.components
    shape = s.either(*map(s.ref, errors)) if len(errors) > 1 else s.ref(errors[0])
    error = {"content": {JSON: {"schema": shape}}}
    described: dict[str, Any] = {
        "operationId": f"{op.method.lower()}{path}",
        "summary": op.summary + (" (an admin key)" if op.admin else ""),
        "tags": [op.tag],
        "responses": {
            "200": {
                "description": "OK",
                "content": {kind: {"schema": schema} for kind, schema in op.reply.items()},
            },
            "4XX": {"description": "The client's mistake, or a refusal", **error},
            "503": {"description": "Not ready, or too busy: retry after Retry-After", **error},
        },
        "security": [] if op.keyless else [{}, {"bearer": []}, {"apiKey": []}],
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": s.STRING}
        for name in _path_parameters(path)
    ] + [{"name": name, "in": "query", "schema": schema} for name, schema in op.query.items()]
    parameters += [{"name": n, "in": "header", "schema": h} for n, h in op.headers.items()]
    if parameters:
        described["parameters"] = parameters
    if op.takes_body:
        if isinstance(op.body, dict):
            content = {"multipart/form-data": {"schema": op.body}}
        else:
            schemas = [bodies[model] for model in op.models] or [s.OBJECT]
            schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
            content = {JSON: {"schema": schema}}
        described["requestBody"] = {"required": op.body is not None, "content": content}
    return described


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]

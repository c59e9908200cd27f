"""llama.cpp's /infill, for editor plugins (errors in llama.cpp's shape)."""

from __future__ import annotations

from mlxserve.api.infill.endpoints import InfillEndpoints
from mlxserve.api.infill.errors import ERRORS
from mlxserve.api.infill.requests import InfillRequest
from mlxserve.api.openapi import shapes as s
from mlxserve.api.table import Route, with_body

ROUTES: tuple[Route[InfillEndpoints], ...] = (
    Route("POST", "/infill", with_body(InfillEndpoints.infill), "Fill in the middle (llama.cpp's shape)", "editors", s.stream(s.INFILLED), ERRORS, InfillRequest),
)  # fmt: skip

"""Neutral errors in llama.cpp's shape: {"error": {"code", "message", "type"}}."""

from __future__ import annotations

from mlxserve.api.errors import ErrorReply, Errors, ErrorShape
from mlxserve.api.openai.errors import STATUS
from mlxserve.protocol.errors import ServiceError


def error_body(error: ServiceError) -> dict:
    status, kind = STATUS[error.kind]
    return {"error": {"code": status, "message": error.message, "type": kind}}


def error_reply(error: ServiceError) -> ErrorReply:
    return ErrorReply(STATUS[error.kind][0], error_body(error), error)


ERRORS = Errors(ErrorShape("LlamaCppError", error_reply))

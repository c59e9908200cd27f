"""Neutral errors in Ollama's shape: {"error": "..."} with the status Ollama gives."""

from __future__ import annotations

from mlxserve.api.errors import ErrorReply, Errors, ErrorShape
from mlxserve.protocol.errors import ErrorKind, ServiceError

# Ollama answers a full queue with a 503, and has no 529: overloaded is a 503 here.
STATUS = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.TIMEOUT: 408,
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.OVERLOADED: 503,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.QUOTA_EXCEEDED: 429,
    ErrorKind.DEPENDENCY_FAILED: 424,
    ErrorKind.INTERNAL: 500,
}


def error_body(error: ServiceError) -> dict:
    """The message names the field at fault (Ollama's bodies have no other place for it)."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return {"error": message}


def error_reply(error: ServiceError) -> ErrorReply:
    return ErrorReply(STATUS[error.kind], error_body(error), error)


ERRORS = Errors(ErrorShape("OllamaError", error_reply))

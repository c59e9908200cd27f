"""Neutral errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from mlxserve.api.errors import ErrorReply, Errors, ErrorShape
from mlxserve.protocol.errors import ErrorKind, ServiceError

# kind -> (status, type)
STATUS = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorKind.AUTHENTICATION: (401, "authentication_error"),
    ErrorKind.FORBIDDEN: (403, "permission_error"),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorKind.CONFLICT: (409, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (413, "invalid_request_error"),
    ErrorKind.TIMEOUT: (408, "invalid_request_error"),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: (415, "invalid_request_error"),
    ErrorKind.UNAVAILABLE: (503, "server_error"),
    ErrorKind.OVERLOADED: (503, "server_error"),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorKind.QUOTA_EXCEEDED: (429, "insufficient_quota"),
    ErrorKind.DEPENDENCY_FAILED: (424, "external_connector_error"),
    ErrorKind.INTERNAL: (500, "server_error"),
}


def error_body(error: ServiceError) -> dict:
    _, kind = STATUS[error.kind]
    return {
        "error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}
    }


def error_reply(error: ServiceError) -> ErrorReply:
    return ErrorReply(STATUS[error.kind][0], error_body(error), error)


ERRORS = Errors(ErrorShape("OpenAIError", error_reply))

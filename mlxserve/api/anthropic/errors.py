"""Neutral errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

from mlxserve.api.errors import ErrorReply, Errors, ErrorShape
from mlxserve.protocol.errors import ContextLengthExceeded, ErrorKind, ServiceError

# kind -> (status, type). Anthropic has no "not ready" status: 503 with api_error, which
# its SDK retries like overloaded_error's 529.
STATUS = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorKind.AUTHENTICATION: (401, "authentication_error"),
    ErrorKind.FORBIDDEN: (403, "permission_error"),
    ErrorKind.NOT_FOUND: (404, "not_found_error"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorKind.CONFLICT: (409, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (413, "request_too_large"),
    ErrorKind.TIMEOUT: (408, "timeout_error"),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: (415, "invalid_request_error"),
    ErrorKind.UNAVAILABLE: (503, "api_error"),
    ErrorKind.OVERLOADED: (529, "overloaded_error"),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorKind.QUOTA_EXCEEDED: (429, "rate_limit_error"),
    ErrorKind.DEPENDENCY_FAILED: (424, "api_error"),
    ErrorKind.INTERNAL: (500, "api_error"),
}


def error_body(error: ServiceError) -> dict:
    message = error.message
    if isinstance(error, ContextLengthExceeded):
        message = _context_message(error)
    elif error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return {"type": "error", "error": {"type": STATUS[error.kind][1], "message": message}}


def _context_message(error: ContextLengthExceeded) -> str:
    """Anthropic's own wording: Claude Code reads these numbers to compact its context."""
    return f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"


def error_reply(error: ServiceError) -> ErrorReply:
    return ErrorReply(STATUS[error.kind][0], error_body(error), error)


ERRORS = Errors(ErrorShape("AnthropicError", error_reply))

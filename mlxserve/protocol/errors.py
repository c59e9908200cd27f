"""Neutral errors: what went wrong (a kind), a message and the offending field.

Raised anywhere; each dialect maps the kind to its own status code and error body, so no
core module knows a wire format."""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    INVALID_REQUEST = "invalid_request"  # the client's mistake
    AUTHENTICATION = "authentication"
    FORBIDDEN = "forbidden"  # not from where this server answers (a Host, an Origin)
    NOT_FOUND = "not_found"  # an unknown model or path
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"  # not now, in this state (unloading a model that is busy)
    TOO_LARGE = "too_large"  # the request body
    TIMEOUT = "timeout"  # the client stopped sending its request
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a body that is not JSON
    UNAVAILABLE = "unavailable"  # not ready: the generation thread is not running
    OVERLOADED = "overloaded"  # too much work now: retry after `retry_after` seconds
    RATE_LIMITED = "rate_limited"  # over an API key's rate or concurrency limit
    QUOTA_EXCEEDED = "quota_exceeded"  # an API key's tokens for the day are spent
    DEPENDENCY_FAILED = "dependency_failed"  # a tool server the request names did not answer
    INTERNAL = "internal"  # a bug


class ServiceError(Exception):
    """An error any layer may raise; `param` names the request field at fault, as the
    dialect that built the request spells it."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


class ContextLengthExceeded(ServiceError):
    """The prompt does not fit the model's context (with room for one token of output).
    Dialects word it their own way from the numbers. An output limit beyond the room left
    is no error: it is a ceiling, and generation stops when the context is full."""

    def __init__(self, prompt_tokens: int, limit: int, param: str, at_least: bool = False):
        """`at_least`: the prompt was refused from its length in characters, before it was
        tokenized: it has at least `prompt_tokens` tokens."""
        size = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        message = (
            f"This model's maximum context length is {limit} tokens. However, your "
            f"prompt is {size} tokens. Please reduce the length of the prompt."
        )
        super().__init__(ErrorKind.INVALID_REQUEST, message, param, "context_length_exceeded")
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class ClientGone(Exception):
    """The client closed its connection: its work is cancelled, nothing is answered."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ServiceError:
    return ServiceError(ErrorKind.INVALID_REQUEST, message, param, code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> ServiceError:
    return ServiceError(ErrorKind.NOT_FOUND, message, param, code)


def dependency_failed(message: str, param: str, code: str) -> ServiceError:
    return ServiceError(ErrorKind.DEPENDENCY_FAILED, message, param, code)


def unavailable(message: str) -> ServiceError:
    return ServiceError(ErrorKind.UNAVAILABLE, message, code="service_unavailable")


def busy(message: str, retry_after_seconds: int) -> ServiceError:
    return ServiceError(
        ErrorKind.OVERLOADED, message, code="server_busy", retry_after=retry_after_seconds
    )


PREEMPTED = "preempted"


def preempted() -> ServiceError:
    """An idle-priority job gave its slot to another request: run it again later."""
    return ServiceError(
        ErrorKind.OVERLOADED,
        "This batch request gave its slot to an interactive one; it runs again later.",
        code=PREEMPTED,
        retry_after=1,
    )


def internal_error(message: str) -> ServiceError:
    return ServiceError(ErrorKind.INTERNAL, message, code="internal_error")

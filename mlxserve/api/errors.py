"""OpenAI error objects, raised anywhere and rendered once by the handler."""

from __future__ import annotations


class APIError(Exception):
    """An error with an HTTP status and the OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}  # extra response headers

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(404, message, "invalid_request_error", param, code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, "server_error", None, "service_unavailable")


def busy(message: str, retry_after_seconds: int) -> APIError:
    return APIError(
        503,
        message,
        "server_error",
        None,
        "server_busy",
        headers={"Retry-After": str(retry_after_seconds)},
    )


def server_error(message: str) -> APIError:
    return APIError(500, message, "server_error", None, "internal_error")

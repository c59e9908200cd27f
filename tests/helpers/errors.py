"""Errors as every dialect must give them."""

from __future__ import annotations


def assert_error(response, status, param=None, code=None, type="invalid_request_error"):
    got_status, headers, body = response
    assert got_status == status, body
    assert headers["Content-Type"] == "application/json"
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type and error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code

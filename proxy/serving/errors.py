"""Errors in the shape of the API the client called.

OpenAI clients expect ``{"error": {"message", "type", "param", "code"}}``; Anthropic clients expect
``{"type": "error", "error": {"type", "message"}}``. Streams that fail after the first byte end
with an error event in the stream's own format instead of being silently truncated.
"""

from __future__ import annotations

import json

from aiohttp import web

from proxy.apis import Dialect, dialect_of

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "unavailable_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


def error_body(dialect: Dialect, status: int, message: str, code: str | None = None) -> bytes:
    if dialect == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        payload: dict[str, object] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = _OPENAI_TYPES.get(status, "server_error")
        payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(payload).encode()


def reshaped_error_body(dialect: Dialect, status: int, body: bytes) -> bytes | None:
    """A backend's error body in the shape of the API the client called; None if it already is.

    llama-server answers errors on /v1/messages in the OpenAI shape (and some as plain text),
    which Anthropic SDKs cannot read; the message is kept, the envelope replaced.
    """
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        if dialect == "openai" or (payload.get("type") == "error" and error.get("type")):
            return None
        return error_body(dialect, status, error["message"])
    text = body.decode("utf-8", "replace").strip()[:500]
    return error_body(dialect, status, text or f"backend answered {status} without a message")


def error_response(
    dialect: Dialect,
    status: int,
    message: str,
    *,
    code: str | None = None,
    retry_after: float | None = None,
) -> web.Response:
    headers = {"Retry-After": str(max(1, round(retry_after)))} if retry_after else None
    return web.Response(
        status=status,
        body=error_body(dialect, status, message, code),
        content_type="application/json",
        headers=headers,
    )


def stream_error_event(api: str, message: str) -> bytes:
    """A terminal SSE event telling a streaming client that the upstream failed mid-stream."""
    if dialect_of(api) == "anthropic":
        body = error_body("anthropic", 502, message).decode()
        return f"event: error\ndata: {body}\n\n".encode()
    if api == "responses":
        event = {"type": "error", "code": "upstream_failed", "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()
    body = error_body("openai", 502, message, code="upstream_failed").decode()
    return f"data: {body}\n\n".encode()

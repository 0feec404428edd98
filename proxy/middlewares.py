"""Middlewares: client authentication and errors in the called API's own shape."""

from __future__ import annotations

import hmac

import structlog
from aiohttp import web

from proxy.errors import Dialect, error_response
from proxy.handlers import Handler
from proxy.state import STATE

log = structlog.get_logger("proxy")

# Paths any client may reach without a key: probes and scrapes (the listener is loopback by
# default; put /metrics behind the network, not behind a client key).
_OPEN_PATHS = frozenset({"/health", "/metrics"})


def dialect_for_path(path: str) -> Dialect:
    return "anthropic" if path.rstrip("/").endswith("/messages") else "openai"


def presented_key(request: web.Request) -> str | None:
    """The client's key, from `Authorization: Bearer` (OpenAI SDK) or `x-api-key` (Anthropic)."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


def key_matches(presented: str, keys: list[str]) -> bool:
    # Compare against every key, always: the time taken says nothing about which key was close.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    return matched


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[STATE].settings.server.api_keys
    if not keys or request.path in _OPEN_PATHS or request.path.startswith("/admin/"):
        return await handler(request)
    presented = presented_key(request)
    if presented is None or not key_matches(presented, [k.get_secret_value() for k in keys]):
        return error_response(
            dialect_for_path(request.path),
            401,
            "invalid or missing API key",
            code="invalid_api_key",
        )
    return await handler(request)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = dialect_for_path(request.path)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = (
            exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        )
        return error_response(dialect, exc.status, message)
    except ConnectionError:
        raise  # the client went away: nobody is left to answer
    except Exception:
        log.exception("unhandled_error", path=request.path, method=request.method)
        return error_response(dialect, 500, "internal error in mtp-proxy")

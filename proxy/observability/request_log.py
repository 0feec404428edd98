"""Who a request is in the logs: its id (the client's X-Request-Id, or a new one) and the logger
bound to it."""

from __future__ import annotations

from aiohttp import web
from structlog.typing import FilteringBoundLogger

from proxy.apis import Api
from proxy.state import STATE

_REQUEST_ID_CHARS = frozenset("0123456789abcdefABCDEF-")
_MAX_LOGGED_CHARS = 512  # of a path or user agent: a hostile client's 8 KiB line stays out

LOGGED = "mtp_proxy.logged"
"""Request key: a handler that writes the request's canonical line itself sets it, and the
access-log middleware (proxy.observability.access_log) then writes none."""


def request_logger(request: web.Request, api: Api | None) -> FilteringBoundLogger:
    base = request.app[STATE].request_log
    return base.bind(
        request_id=request_id(request),
        method=request.method,
        path=request.path_qs[:_MAX_LOGGED_CHARS],
        user_agent=request.headers.get("User-Agent", "")[:_MAX_LOGGED_CHARS] or None,
        api=api,
    )


def request_id(request: web.Request) -> str:
    """The client's X-Request-Id when it is a plain hex/uuid string, else a new one (kept on the
    request, so every line about it carries the same id)."""
    known = request.get("request_id")
    if isinstance(known, str):
        return known
    given = request.headers.get("X-Request-Id", "")
    valid = 0 < len(given) <= 64 and set(given) <= _REQUEST_ID_CHARS
    chosen = given if valid else request.app[STATE].request_ids.new()
    request["request_id"] = chosen
    return chosen

"""The canonical request line for every request that no handler logs itself.

Generation requests write a rich line of their own (route, tokens, timings); everything else (a
404, a 405, a HEAD, /v1/models, /health, a forwarded /tokenize) gets one here, with the same
fields: method, path with its query, user agent, status, duration. So the log shows what every
client calls, including what the proxy does not serve; the polls of /health and /metrics at
debug level.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.apis import CLIENT_CLOSED
from proxy.observability.request_log import LOGGED, request_logger
from proxy.state import STATE

LOG_FIELDS = "mtp_proxy.log_fields"
"""Request key: extra fields for the line (e.g. the model and backend a forwarded call used)."""
POLLED_PATHS = frozenset({"/health", "/v1/health", "/metrics"})
"""Paths that monitors poll (systemd-style health checks, Prometheus every 15 s: thousands of
lines a day): their lines are debug, not info."""


@web.middleware
async def access_log_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    received = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except (asyncio.CancelledError, ConnectionError):
        status = CLIENT_CLOSED
        raise
    finally:
        if not request.get(LOGGED):
            _defer_line(request, status, time.perf_counter() - received)


def _defer_line(request: web.Request, status: int, elapsed: float) -> None:
    fields = request.get(LOG_FIELDS) or {}

    polled = request.path in POLLED_PATHS

    def record() -> None:
        logger = request_logger(request, fields.pop("api", None))
        write = logger.debug if polled else logger.info
        write("request", status=status, duration_s=round(elapsed, 4), **fields)

    request.app[STATE].bookkeeping.defer(record)

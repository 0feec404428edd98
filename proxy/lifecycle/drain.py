"""Graceful shutdown: count the requests in flight and let them finish before the backends stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

log = structlog.get_logger("proxy")


class RequestCount:
    """Requests being handled (streams included), so that shutdown can wait for them."""

    def __init__(self) -> None:
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in flight; False if some still are after timeout_s."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


REQUESTS = web.AppKey("requests", RequestCount)


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    with request.app[REQUESTS].track():
        return await handler(request)


async def drain(runner: web.AppRunner, requests: RequestCount, timeout_s: float) -> None:
    """Stop accepting connections and let the requests in flight finish, up to timeout_s.

    aiohttp's own shutdown would wait up to twice its timeout (once for the handlers, once
    more after cancelling their request bodies), so the wait is done here and aiohttp's kept
    short for what is left.
    """
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close now, busy ones after
    if not await requests.wait_idle(timeout_s):
        log.warning("drain_timed_out", in_flight=requests.active, timeout_s=timeout_s)

"""Bookkeeping no client waits for, run in batches a moment after the answers went out.

A finished request's telemetry, metrics, learned statistics and log line are deferred by a few
milliseconds and run in a batch: run right after the answer, that work delayed the *next*
request of a client that sends back to back, as a coding agent's loop does (docs/benchmarks.md,
"Overhead"); deferred, it runs while the backends compute, on warm caches.

Whatever reads what the bookkeeping writes (/metrics, /admin/routing, the statistics file)
calls `flush` first, so no request that finished before the read is missing from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

log = structlog.get_logger("proxy.bookkeeping")

Work = Callable[[], object]

DELAY_S = 0.005
"""Long enough for a back-to-back client's next request to be forwarded first (its
pre-forward path takes ~0.5 ms cold), short enough that nobody sees a log line late."""


class Bookkeeping:
    def __init__(self, delay_s: float = DELAY_S) -> None:
        self.delay_s = delay_s
        self._pending: list[Work] = []
        self._timer: asyncio.TimerHandle | None = None

    def defer(self, work: Work) -> None:
        self._pending.append(work)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self.flush)

    def flush(self) -> None:
        """Run everything deferred so far, now; one failure does not stop the rest."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for work in pending:
            try:
                work()
            except Exception:  # a bug in bookkeeping must not lose the others
                log.exception("bookkeeping_failed")

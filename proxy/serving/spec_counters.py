"""Draft acceptance (and decode speed) for APIs that report no timings, from a backend's
/metrics spec counters (and its decode clock, tokens_predicted_seconds_total).

`/v1/messages` (what Claude Code speaks) and non-stream `/v1/responses` carry no `draft_n`. The
backend's `llamacpp:spec_decode_num_*` counters do, but per backend, not per request. The movement
of the counters is exactly one request's when that request ran alone: every earlier request had
finished at the previous reading, and none started while it ran. Otherwise it stays unknown.
"""

from __future__ import annotations

import asyncio

import aiohttp

from proxy.routing.telemetry import SpecCounters, parse_spec_counters
from proxy.serving.backends import LiveBackend

_TIMEOUT_S = 2.0


class SpecCounterTracker:
    def __init__(self) -> None:
        # backend -> (counters, requests started by then), read while the backend was idle
        self._baselines: dict[str, tuple[SpecCounters, int]] = {}

    async def delta_after(
        self, session: aiohttp.ClientSession, backend: LiveBackend, sequence: int
    ) -> SpecCounters | None:
        """Read the counters after request number `sequence` finished; its exact delta or None."""
        counters = await self._read(session, backend)
        if counters is None:
            return None
        previous = self._baselines.get(backend.name)
        alone = backend.started_total == sequence and backend.in_flight == 0
        if backend.in_flight == 0:
            self._baselines[backend.name] = (counters, backend.started_total)
        if previous is None or not alone or previous[1] != sequence - 1:
            return None
        return counters - previous[0]

    async def _read(
        self, session: aiohttp.ClientSession, backend: LiveBackend
    ) -> SpecCounters | None:
        if backend.base_url is None:  # it stopped since the request finished
            return None
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                return await read_spec_counters(session, backend.base_url)
        except (aiohttp.ClientError, TimeoutError):
            return None


async def read_spec_counters(session: aiohttp.ClientSession, base_url: str) -> SpecCounters | None:
    """A backend's spec counters now; None when /metrics does not answer 200 or lacks them.
    A connection failure or timeout raises (aiohttp.ClientError, TimeoutError)."""
    async with session.get(f"{base_url}/metrics") as response:
        if response.status != 200:
            return None
        return parse_spec_counters(await response.text())

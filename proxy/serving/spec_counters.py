"""Draft acceptance (and decode speed) for APIs that report no timings, from a backend's
/metrics spec counters (and its decode clock, tokens_predicted_seconds_total).

`/v1/messages` (what Claude Code speaks) and non-stream `/v1/responses` carry no `draft_n`. The
backend's `llamacpp:spec_decode_num_*` counters do, but per backend, not per request. llama-server
adds a request to them when it releases the request's slot, right after its final answer and
before it reads the next task, so a reading taken after an answer arrived holds that request and
every one before it. The movement between two readings is exactly one request's when that
request ran alone: the reading before it was taken with nothing else on the backend, and the one
after it too, with nothing else started meanwhile. Otherwise it stays unknown.

A reading is therefore taken the moment an answer has arrived, before it goes on to the client
(``after``): a client that sends its next request as soon as it has an answer (an agent's loop)
used to find the counters read only after that next request was on the backend, and 7 of 12
requests that ran alone taught nothing. A backend that becomes ready is read once too
(``baseline``), so its first request has a reading before it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from proxy.routing.telemetry import SpecCounters, parse_spec_counters
from proxy.serving.backends import LiveBackend

_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class _Moment:
    """A backend when a reading was asked for: requests sent to it, none in flight, its process."""

    sent: int
    idle: bool
    generation: int

    @classmethod
    def of(cls, backend: LiveBackend) -> _Moment:
        return cls(backend.started_total, backend.in_flight == 0, backend.generation)


class SpecCounterTracker:
    def __init__(self) -> None:
        # backend -> (counters, requests sent to it by then), read with all of them finished
        self._baselines: dict[str, tuple[SpecCounters, int]] = {}

    def after(
        self, session: aiohttp.ClientSession, backend: LiveBackend, sequence: int
    ) -> asyncio.Task[SpecCounters | None]:
        """Read the counters now that request number ``sequence`` has its whole answer: its
        exact movement, or None if it did not run alone (or a reading is missing)."""
        alone = backend.started_total == sequence and backend.in_flight == 0
        moment = _Moment.of(backend)
        return asyncio.get_running_loop().create_task(
            self._delta(session, backend, moment, alone=alone)
        )

    def baseline(self, session: aiohttp.ClientSession, backend: LiveBackend) -> asyncio.Task[None]:
        """Read the counters of a backend that just became ready (nothing sent to it yet)."""
        moment = _Moment.of(backend)

        async def read() -> None:
            await self._take(session, backend, moment)

        return asyncio.get_running_loop().create_task(read())

    async def _delta(
        self, session: aiohttp.ClientSession, backend: LiveBackend, moment: _Moment, *, alone: bool
    ) -> SpecCounters | None:
        previous = self._baselines.get(backend.name)
        counters = await self._take(session, backend, moment)
        if counters is None or previous is None or not alone or previous[1] != moment.sent - 1:
            return None
        return counters - previous[0]

    async def _take(
        self, session: aiohttp.ClientSession, backend: LiveBackend, moment: _Moment
    ) -> SpecCounters | None:
        """A reading asked for at ``moment``; kept as the baseline of the next request if it
        holds exactly the requests sent by then: all of them finished then, and none of those
        sent since had finished when it came back (one that had may be in it too)."""
        counters = await self._read(session, backend)
        finished = backend.started_total - backend.in_flight
        same = backend.generation == moment.generation
        clean = moment.idle and finished == moment.sent and same
        if counters is not None and clean:
            self._baselines[backend.name] = (counters, moment.sent)
        return counters if clean else None

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

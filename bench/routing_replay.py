"""Replay a trace against a running proxy, as clients would send it, and time every answer.

Each session's turns go in order, each no earlier than its ``at`` (trace seconds / time scale)
and after the previous turn finished; one-shot requests go at their ``at``. A ``Pinner`` may
add headers per request (the static and reference policies pin a profile with X-MTP-Profile);
its own time (the predictions of the greedy one) is not counted in the request's latency.

Every request's *load* is counted at its send: the requests this client has outstanding at that
moment, itself included. With one backend (one copy of the weights) that is what is decoding or
queued there; with a pool, what the whole model has in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from proxy.workloads.trace import TraceRequest

Progress = Callable[[int, int], None]


def sessions_of(requests: Iterable[TraceRequest]) -> dict[str | None, list[TraceRequest]]:
    """Requests grouped by session (None: the one-shot requests), each group in trace order."""
    groups: dict[str | None, list[TraceRequest]] = {}
    for r in requests:
        groups.setdefault(r.session, []).append(r)
    return groups


class Pinner(Protocol):
    """Adds headers to a request before it is sent (its time is not the request's)."""

    async def pin(self, r: TraceRequest, load: int) -> dict[str, str]:
        """Headers for ``r``; ``load``: requests outstanding at its send, itself included."""

    def done(self, r: TraceRequest) -> None:
        """The request has been answered (or failed)."""


@dataclass(frozen=True)
class Outcome:
    """One answered request, as the client saw it (wall seconds, relative to the start)."""

    index: int
    session: str | None
    path: str
    sent: float
    latency: float
    ttfb: float
    status: int
    output_tokens: int
    prompt_tokens: int | None
    predicted_n: int | None  # backend timings, when the answer carries them
    predicted_ms: float | None
    profile: str
    reason: str
    backend: str
    load: int  # requests outstanding at its send, itself included


@dataclass
class _Usage:
    output: int | None = None
    prompt: int | None = None
    timings: dict[str, Any] | None = None

    def read(self, obj: object) -> None:
        if not isinstance(obj, dict):
            return
        for holder in (obj, obj.get("response"), obj.get("message")):
            if not isinstance(holder, dict):
                continue
            if isinstance(holder.get("timings"), dict):
                self.timings = holder["timings"]
            usage = holder.get("usage")
            if isinstance(usage, dict):
                out = usage.get("completion_tokens", usage.get("output_tokens"))
                if isinstance(out, int) and out > 0:
                    self.output = out
                prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
                if isinstance(prompt, int) and prompt > 0:
                    self.prompt = prompt + int(usage.get("cache_read_input_tokens") or 0)

    def output_tokens(self) -> int:
        if self.output is not None:
            return self.output
        n = (self.timings or {}).get("predicted_n")
        return n if isinstance(n, int) else 0

    def prompt_tokens(self) -> int | None:
        t = self.timings or {}
        if isinstance(t.get("prompt_n"), int):
            return int(t["prompt_n"]) + int(t.get("cache_n") or 0)
        return self.prompt


def _read_sse(raw: bytes) -> _Usage:
    usage = _Usage()
    for event in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if b'"usage"' not in event and b'"timings"' not in event:
            continue
        data = b"\n".join(ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:"))
        if data and data != b"[DONE]":
            try:
                usage.read(json.loads(data))
            except ValueError:
                continue
    return usage


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


class Replayer:
    def __init__(self, url: str, time_scale: float, pinner: Pinner | None = None) -> None:
        self.url = url
        self.scale = time_scale
        self.pinner = pinner
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []
        self._start = 0.0
        self._in_flight = 0

    async def run(
        self,
        trace: list[TraceRequest],
        progress: Progress | None = None,
        timed: Sequence[tuple[float, Callable[[], Awaitable[None]]]] = (),
    ) -> float:
        """Replay the whole trace; returns the wall seconds it took. ``timed``: (trace seconds,
        action) pairs run at those times (a fault turned on in a backend, say)."""
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        total = len(trace)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self._start = time.perf_counter()

            async def one(requests: list[TraceRequest]) -> None:
                for r in requests:
                    await self._send(http, r)
                    if progress is not None:
                        progress(len(self.outcomes) + len(self.errors), total)

            async def at(when: float, action: Callable[[], Awaitable[None]]) -> None:
                await asyncio.sleep(max(self._start + when / self.scale - time.perf_counter(), 0))
                await action()

            groups = sessions_of(trace)
            tasks = [one(reqs) for key, reqs in groups.items() if key is not None]
            tasks += [one([r]) for r in groups.get(None, [])]
            tasks += [at(when, action) for when, action in timed]
            await asyncio.gather(*tasks)
        self.outcomes.sort(key=lambda o: o.index)
        return time.perf_counter() - self._start

    async def _send(self, http: aiohttp.ClientSession, r: TraceRequest) -> None:
        payload = json.dumps(r.body).encode()  # before the clock starts, as a client would
        delay = self._start + r.at / self.scale - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        headers = {"X-Request-Id": f"{r.index:08x}", "Content-Type": "application/json"}
        self._in_flight += 1
        load = self._in_flight
        try:
            if self.pinner is not None:
                headers.update(await self.pinner.pin(r, load))
            await self._post(http, r, payload, headers, load)
        finally:
            self._in_flight -= 1
            if self.pinner is not None:
                self.pinner.done(r)

    async def _post(
        self,
        http: aiohttp.ClientSession,
        r: TraceRequest,
        payload: bytes,
        headers: dict[str, str],
        load: int,
    ) -> None:
        sent = time.perf_counter()
        first: float | None = None
        try:
            async with http.post(self.url + r.path, data=payload, headers=headers) as resp:
                chunks: list[bytes] = []
                async for chunk in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    chunks.append(chunk)
                done = time.perf_counter()
                raw = b"".join(chunks)
                if resp.status != 200:
                    self.errors.append(f"#{r.index} {resp.status}: {raw[:200]!r}")
                    return
                stream = resp.headers.get("Content-Type", "").startswith("text/event-stream")
                usage = _read_sse(raw) if stream else _Usage()
                if not stream:
                    usage.read(json.loads(raw))
                self.outcomes.append(self._outcome(r, resp.headers, sent, done, first, usage, load))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.errors.append(f"#{r.index} {type(exc).__name__}: {exc}")

    def _outcome(
        self,
        r: TraceRequest,
        headers: Any,
        sent: float,
        done: float,
        first: float | None,
        usage: _Usage,
        load: int,
    ) -> Outcome:
        timings = usage.timings or {}
        return Outcome(
            index=r.index,
            session=r.session,
            path=r.path,
            sent=sent - self._start,
            latency=done - sent,
            ttfb=(first or done) - sent,
            status=200,
            output_tokens=usage.output_tokens(),
            prompt_tokens=usage.prompt_tokens(),
            predicted_n=timings.get("predicted_n") if timings else None,
            predicted_ms=_number(timings.get("predicted_ms")) if timings else None,
            profile=headers.get("X-MTP-Profile", "?"),
            reason=headers.get("X-MTP-Route-Reason", "?"),
            backend=headers.get("X-MTP-Backend", "?"),
            load=load,
        )

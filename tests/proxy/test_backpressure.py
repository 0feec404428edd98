"""Backpressure on a real proxy: bursts past capacity end served or refused cleanly, never hung.

Backends are simulators decoding at a flat 50 tokens/s (bench.load's paced preset), so a request
of N tokens holds its slot N/50 s. `mtp-demo` has two backends of 2 slots (capacity 4), `solo`
one backend of 1 slot. The queue holds at most 4 requests per model for at most 1.5 s.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from bench.load import paced_preset, simulator_args
from tests.support.harness import ADMIN_KEY, ProxyProcess, proxy_config, running_proxy
from tests.support.traffic import watch_in_flight

TOK_S = 50.0
MAX_QUEUE = 4
QUEUE_TIMEOUT_S = 1.5
CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def pressured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("backpressure")
    preset = paced_preset(workdir, TOK_S)
    demo = {
        "name": "mtp-demo",
        "backend": "simulator",
        "args": simulator_args(preset, 2),
        "profiles": [{"name": "off", "replicas": 2}],
    }
    solo = {
        "name": "solo",
        "backend": "simulator",
        "args": simulator_args(preset, 1),
        "profiles": [{"name": "off"}],
    }
    server = {"max_queue": MAX_QUEUE, "queue_timeout_s": QUEUE_TIMEOUT_S}
    with running_proxy(proxy_config([demo, solo], server=server), workdir / "proxy") as proxy:
        yield proxy


@dataclass
class Outcome:
    n: int
    api: str
    status: int
    body: bytes
    headers: dict[str, str]
    started: float
    ended: float

    @property
    def took(self) -> float:
        return self.ended - self.started


async def call(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    n: int,
    *,
    api: str = "chat",
    model: str = "mtp-demo",
    tokens: int = 25,
    stream: bool = True,
) -> Outcome:
    path = "/v1/messages" if api == "messages" else "/v1/chat/completions"
    body = {
        "model": model,
        "messages": CHAT,
        "max_tokens": tokens,
        "stream": stream,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    async with session.post(proxy.url + path, json=body) as response:
        raw = await response.read()
        headers = dict(response.headers)
        return Outcome(n, api, response.status, raw, headers, started, time.perf_counter())


def assert_served_or_refused(outcome: Outcome, *, stream: bool) -> None:
    """200 with a complete answer, or 429 in the API's shape with Retry-After; nothing else."""
    if outcome.status == 200:
        if stream and outcome.api == "messages":
            assert b"event: message_stop" in outcome.body
        elif stream:
            assert outcome.body.rstrip().endswith(b"data: [DONE]")
        else:
            assert json.loads(outcome.body)["usage"]
        return
    assert outcome.status == 429, (outcome.status, outcome.body[:200])
    assert int(outcome.headers["Retry-After"]) >= 1
    error = json.loads(outcome.body)
    if outcome.api == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
    else:
        assert error["error"]["type"] == "rate_limit_error" and error["error"]["message"]


def queued_gauge(proxy: ProxyProcess, model: str) -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("mtp_proxy_queued_requests{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no queued_requests gauge for " + model)


def in_flight(proxy: ProxyProcess, model: str) -> int:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return sum(r["in_flight"] for r in rows if r["model"] == model)


async def until(what: str, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll the proxy's own state until `condition` holds (bounded): an event, not a guess."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)


async def solo_holds(proxy: ProxyProcess, queued: int) -> None:
    """Wait until solo's slot is taken and `queued` requests wait for it."""
    await until("solo's slot taken", lambda: in_flight(proxy, "solo") == 1)
    await until(f"{queued} queued", lambda: queued_gauge(proxy, "solo") == queued)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_burst_of_five_times_capacity_is_served_or_refused_cleanly(
    pressured: ProxyProcess, stream: bool
) -> None:
    capacity = 4
    seen: dict[str, int] = {}
    stop = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        watcher = asyncio.create_task(watch_in_flight(pressured, seen, stop))
        outcomes = await asyncio.gather(
            *(
                call(session, pressured, n, api="messages" if n % 2 else "chat", stream=stream)
                for n in range(5 * capacity)
            )
        )
        stop.set()
        await watcher
    for outcome in outcomes:
        assert_served_or_refused(outcome, stream=stream)
        # Nobody hangs: served ones within a few services, refused ones within the queue timeout.
        assert outcome.took < QUEUE_TIMEOUT_S + 3.0, outcome
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    assert len(served) + len(refused) == 5 * capacity
    assert capacity <= len(served) <= capacity + MAX_QUEUE
    assert len(refused) >= 5 * capacity - capacity - MAX_QUEUE
    assert all(o.took < 1.0 for o in refused if b"already waiting" in o.body)  # full queue: at once
    assert seen["mtp-demo/off#1"] <= 2 and seen["mtp-demo/off#2"] <= 2  # never past the slots
    await settled(pressured, "mtp-demo")


async def settled(proxy: ProxyProcess, model: str) -> None:
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
        if all(r["in_flight"] == 0 for r in rows if r["model"] == model):
            break
        await asyncio.sleep(0.05)
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    assert all(r["in_flight"] == 0 for r in rows if r["model"] == model), rows
    assert queued_gauge(proxy, model) == 0


async def test_waiting_past_the_queue_timeout_is_refused(pressured: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        holder = asyncio.create_task(call(session, pressured, 0, model="solo", tokens=150))
        await solo_holds(pressured, 0)  # the slot is taken for 3 s
        waiting = await asyncio.gather(
            *(
                call(session, pressured, n, model="solo", api=api)
                for n, api in ((1, "chat"), (2, "messages"))
            )
        )
        held = await holder
    assert held.status == 200
    for outcome in waiting:
        assert outcome.status == 429
        assert_served_or_refused(outcome, stream=True)
        assert QUEUE_TIMEOUT_S * 0.9 < outcome.took < QUEUE_TIMEOUT_S + 5.0
    await settled(pressured, "solo")


async def test_queued_requests_are_served_in_arrival_order(pressured: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        tasks = []
        # One in the slot for 0.6 s, four queued one after the other (0.16 s each: the last
        # waits ~1.1 s, inside the queue timeout).
        for n in range(1 + MAX_QUEUE):
            tokens = 30 if n == 0 else 8
            tasks.append(
                asyncio.create_task(call(session, pressured, n, model="solo", tokens=tokens))
            )
            await solo_holds(pressured, n)  # n is in line before n + 1 is sent
        outcomes = await asyncio.gather(*tasks)
    assert [o.status for o in outcomes] == [200] * (1 + MAX_QUEUE)
    by_end = sorted(outcomes, key=lambda o: o.ended)
    assert [o.n for o in by_end] == list(range(1 + MAX_QUEUE))
    await settled(pressured, "solo")


async def test_a_client_leaving_the_queue_frees_its_place(pressured: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        holder = asyncio.create_task(call(session, pressured, 0, model="solo", tokens=40))
        await solo_holds(pressured, 0)
        leaving = asyncio.create_task(call(session, pressured, 1, model="solo", tokens=10))
        await solo_holds(pressured, 1)
        staying = asyncio.create_task(call(session, pressured, 2, model="solo", tokens=10))
        await solo_holds(pressured, 2)
        leaving.cancel()  # closes its connection: the proxy drops it from the queue
        await asyncio.gather(leaving, return_exceptions=True)
        await until("the leaver out of the queue", lambda: queued_gauge(pressured, "solo") == 1)
        assert in_flight(pressured, "solo") == 1  # the holder still has the slot
        held, stayed = await asyncio.gather(holder, staying)
    assert held.status == 200 and stayed.status == 200
    assert stayed.ended - held.ended < 1.0  # it took the freed slot at once, not a dead waiter's
    await settled(pressured, "solo")


async def test_a_session_kept_on_its_full_cache_holder_waits_for_its_slots(
    tmp_path: Path,
) -> None:
    """A session with a long prompt stays on the backend holding its cache (processing it again
    elsewhere would cost more than waiting: at the prior prefill speed, not learned here, 20 s).
    While that backend is full, its requests wait in the proxy, in order, instead of going past
    its 2 slots into llama-server's own queue (pins waited so already; affinity did not)."""
    preset = paced_preset(tmp_path, TOK_S)
    demo = {
        "name": "mtp-demo",
        "backend": "simulator",
        "args": simulator_args(preset, 2),
        "profiles": [{"name": "off", "replicas": 2}],
    }
    config = proxy_config([demo], routing={"learning": False})
    prompt = "The keeper logged the weather at every watch. " * 2000  # ~20k tokens
    headers = {"X-MTP-Session": "one-long-session"}
    with running_proxy(config, tmp_path / "proxy") as proxy:

        async def turn(session: aiohttp.ClientSession, tokens: int) -> tuple[int, str]:
            body = {
                "model": "mtp-demo",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens,
                "stream": True,
                "ignore_eos": True,
            }
            async with session.post(
                proxy.url + "/v1/chat/completions", json=body, headers=headers
            ) as response:
                await response.read()
                return response.status, response.headers.get("X-MTP-Backend", "")

        seen: dict[str, int] = {}
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            status, holder = await turn(session, 4)  # the session's cache is on `holder` now
            assert status == 200 and holder
            watcher = asyncio.create_task(watch_in_flight(proxy, seen, stop))
            outcomes = await asyncio.gather(*(turn(session, 25) for _ in range(5)))
            stop.set()
            await watcher
    assert outcomes == [(200, holder)] * 5  # every turn stayed with its cache
    assert seen[holder] == 2, seen  # and the holder never took more than its slots

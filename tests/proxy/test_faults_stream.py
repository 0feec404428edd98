"""Faults on real processes: backends that die, hang or flood, and clients that stall or vanish.

One proxy serves two models. `mtp-demo` has two simulated backends (off, min) and one remote
backend `bad` (tests/support/misbehaving_backend.py), which each request tells how to fail with the
`X-Misbehave` header (the proxy forwards it like any end-to-end header). `fragile` has only the
misbehaving backend, so a failure there has nowhere to be retried.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
)
from tests.support.misbehaving_backend import running_backend

CHAT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
IDLE_S = 1.0
FIRST_BYTE_S = 1.5
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
APIS = sorted(PATHS)


@pytest.fixture(scope="module")
def faulty_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with running_backend("ok", "--chunks", "3") as bad_url:
        demo = simulator_model(
            slots=8,
            profiles=[
                {"name": "off"},
                {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2},
                {"name": "bad", "url": bad_url},
            ],
        )
        fragile = {
            "name": "fragile",
            "backend": "simulator",
            "profiles": [{"name": "bad", "url": bad_url}],
        }
        server = {
            "connect_timeout_s": 1.0,
            "first_byte_timeout_s": FIRST_BYTE_S,
            "idle_timeout_s": IDLE_S,
        }
        config = proxy_config([demo, fragile], server=server)
        with running_proxy(config, tmp_path_factory.mktemp("faults")) as proxy:
            yield proxy


def body_for(api: str, *, model: str = "mtp-demo", tokens: int = 4000) -> dict[str, Any]:
    if api == "responses":
        prompt: dict[str, Any] = {"input": CHAT[0]["content"], "max_output_tokens": tokens}
    elif api == "completions":
        prompt = {"prompt": CHAT[0]["content"], "max_tokens": tokens}
    else:
        prompt = {"messages": CHAT, "max_tokens": tokens}
    # ignore_eos: the simulator keeps going until max_tokens
    return {"model": model, **prompt, "stream": True, "ignore_eos": True}


@dataclass
class StreamRead:
    status: int
    raw: bytes = b""
    arrivals: list[float] = field(default_factory=list)  # perf_counter of each chunk
    ended_at: float = 0.0
    backend: str = ""


async def read_stream(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    api: str,
    headers: dict[str, str],
    *,
    on_first_chunk: Any = None,
    model: str = "mtp-demo",
) -> StreamRead:
    async with session.post(
        proxy.url + PATHS[api], json=body_for(api, model=model), headers=headers
    ) as response:
        read = StreamRead(response.status, backend=response.headers.get("X-MTP-Backend", ""))
        async for chunk in response.content.iter_any():
            read.arrivals.append(time.perf_counter())
            read.raw += chunk
            if on_first_chunk is not None and len(read.arrivals) == 1:
                on_first_chunk()
        read.ended_at = time.perf_counter()
    return read


def assert_terminal_error_event(raw: bytes, api: str) -> None:
    """The stream's last event is a well-formed error in the stream's own format."""
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    last = events[-1]
    if api in ("messages", "responses"):  # named SSE events
        name, data = last.split("\n", 1)
        assert name == "event: error"
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == "error"
        if api == "messages":  # Anthropic: {"type": "error", "error": {type, message}}
            assert payload["error"]["type"] and payload["error"]["message"]
        else:  # Responses: the error event carries code and message itself
            assert payload["code"] and payload["message"]
            assert set(payload) == {"type", "code", "message", "param"}
    else:  # OpenAI chat and completions: a data line with an error object
        assert last.startswith("data: ")
        payload = json.loads(last.removeprefix("data: "))
        assert payload["error"]["message"] and payload["error"]["type"]
    errors = [e for e in events if e.startswith("event: error") or e.startswith('data: {"error"')]
    assert errors == [last]  # one error event, the last one
    for success in (b"[DONE]", b"message_stop", b"response.completed"):
        assert success not in raw  # not dressed up as a success


def backend_tokens(raw: bytes) -> int:
    return len(re.findall(rb"token\d+ ", raw))  # what tests/support/misbehaving_backend.py sends


def backends(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return {row["name"]: row for row in rows}


async def wait_ready(proxy: ProxyProcess, name: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = backends(proxy)[name]
        if row["state"] == "ready":
            return row
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} not ready again after {timeout}s: {backends(proxy)[name]}")


@pytest.mark.parametrize(
    ("api", "profile"),
    [("chat", "off"), ("messages", "min"), ("responses", "off"), ("completions", "min")],
)
async def test_backend_killed_mid_stream_ends_with_an_error_event(
    faulty_proxy: ProxyProcess, api: str, profile: str
) -> None:
    row = await wait_ready(faulty_proxy, f"mtp-demo/{profile}")
    killed_at = 0.0

    def kill() -> None:
        nonlocal killed_at
        killed_at = time.perf_counter()
        os.kill(int(row["pid"]), signal.SIGKILL)

    async with aiohttp.ClientSession() as session:
        read = await read_stream(
            session, faulty_proxy, api, {"X-MTP-Profile": profile}, on_first_chunk=kill
        )
    assert read.status == 200 and read.backend == f"mtp-demo/{profile}"
    assert_terminal_error_event(read.raw, api)
    assert read.ended_at - killed_at < 1.0, "the error event came later than 1 s after the kill"
    await wait_ready(faulty_proxy, f"mtp-demo/{profile}")  # the supervisor restarts it


@pytest.mark.parametrize("api", APIS)
async def test_backend_dropping_the_connection_mid_stream_ends_with_an_error_event(
    faulty_proxy: ProxyProcess, api: str
) -> None:
    headers = {"X-MTP-Profile": "bad", "X-Misbehave": "close-after-chunks:3"}
    async with aiohttp.ClientSession() as session:
        read = await read_stream(session, faulty_proxy, api, headers)
    assert read.status == 200
    assert backend_tokens(read.raw) == 3  # what the backend sent arrived before the error
    assert_terminal_error_event(read.raw, api)


@pytest.mark.parametrize("api", APIS)
async def test_backend_going_silent_mid_stream_hits_the_idle_timeout(
    faulty_proxy: ProxyProcess, api: str
) -> None:
    headers = {"X-MTP-Profile": "bad", "X-Misbehave": "hang-after-chunks:2"}
    async with aiohttp.ClientSession() as session:
        read = await read_stream(session, faulty_proxy, api, headers)
    assert backend_tokens(read.raw) == 2
    assert_terminal_error_event(read.raw, api)
    silence = read.ended_at - read.arrivals[-2]  # last backend chunk -> error event
    assert IDLE_S * 0.8 < silence < IDLE_S + 5.0


@pytest.mark.parametrize("mode", ["close-before-headers", "hang-before-headers"])
async def test_failure_before_the_first_byte_is_retried_on_another_backend(
    faulty_proxy: ProxyProcess, mode: str
) -> None:
    await wait_ready(faulty_proxy, "mtp-demo/off")
    await wait_ready(faulty_proxy, "mtp-demo/min")
    headers = {"X-MTP-Profile": "bad", "X-Misbehave": mode}
    body = {**body_for("chat", tokens=8), "stream": False}
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession() as session,
        session.post(faulty_proxy.url + PATHS["chat"], json=body, headers=headers) as response,
    ):
        answer = await response.json()
    took = time.perf_counter() - started
    assert response.status == 200, answer
    assert response.headers["X-MTP-Backend"] in {"mtp-demo/off", "mtp-demo/min"}
    assert answer["choices"][0]["message"]["content"]
    if mode == "hang-before-headers":
        assert FIRST_BYTE_S * 0.8 < took < FIRST_BYTE_S + 3.0  # waited for the timeout, once
    failures = [
        line
        for line in faulty_proxy.log_lines()
        if line.get("event") == "upstream_unavailable" and line.get("backend") == "mtp-demo/bad"
    ]
    assert failures, "the failed attempt on the bad backend was not logged"


@pytest.mark.parametrize("api", ["chat", "messages"])
async def test_no_backend_left_to_retry_fails_cleanly(faulty_proxy: ProxyProcess, api: str) -> None:
    headers = {"X-Misbehave": "hang-before-headers"}
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            faulty_proxy.url + PATHS[api], json=body_for(api, model="fragile"), headers=headers
        ) as response,
    ):
        error = await response.json()
    took = time.perf_counter() - started
    assert response.status == 502
    assert int(response.headers["Retry-After"]) >= 1
    if api == "messages":
        assert error["type"] == "error" and error["error"]["message"]
    else:
        assert error["error"]["message"] and error["error"]["type"]
    assert took < FIRST_BYTE_S + 3.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_slow_reading_client_keeps_proxy_memory_bounded(faulty_proxy: ProxyProcess) -> None:
    """A backend floods 256 MB at a client that reads nothing: the proxy must not buffer it."""
    pid = faulty_proxy.process.pid
    before = rss_mb(pid)
    headers = {"X-MTP-Profile": "bad", "X-Misbehave": "flood"}
    async with (
        aiohttp.ClientSession(read_bufsize=2**16) as session,
        session.post(
            faulty_proxy.url + PATHS["chat"], json=body_for("chat"), headers=headers
        ) as response,
    ):
        assert response.status == 200
        await response.content.readany()
        peak = before
        for _ in range(20):  # 2 s of not reading while the backend pushes
            await asyncio.sleep(0.1)
            peak = max(peak, rss_mb(pid))
        received = 0
        for _ in range(50):  # then read a little, slowly
            received += len(await response.content.readany())
            await asyncio.sleep(0.01)
        assert received > 0
        response.close()
    assert peak - before < 40, f"proxy RSS grew {peak - before:.0f} MB for a stalled client"
    await wait_idle(faulty_proxy, "mtp-demo/bad")


async def wait_idle(proxy: ProxyProcess, name: str, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backends(proxy)[name]["in_flight"] == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} still has requests in flight {timeout}s after the client left")


async def busy_slots(session: aiohttp.ClientSession, port: int) -> int:
    async with session.get(f"http://127.0.0.1:{port}/slots") as response:
        return sum(1 for slot in await response.json() if slot["is_processing"])


def client_closed_lines(proxy: ProxyProcess, request_ids: set[str]) -> int:
    return sum(
        1
        for line in proxy.log_lines()
        if line.get("event") == "request"
        and line.get("status") == 499
        and line.get("request_id") in request_ids
    )


async def test_client_disconnect_storm_frees_every_backend_slot(faulty_proxy: ProxyProcess) -> None:
    # Counted by request id: an earlier test's abandoned request may be logged during this one.
    request_ids: set[str] = set()
    ports = {}
    for profile in ("off", "min"):
        ports[profile] = int((await wait_ready(faulty_proxy, f"mtp-demo/{profile}"))["port"])
    async with aiohttp.ClientSession() as probe:
        for _ in range(3):  # three storms in a row: 16 streams vanish at once
            async with AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(aiohttp.ClientSession()) for _ in range(16)
                ]
                ids = [uuid.uuid4().hex for _ in clients]
                request_ids.update(ids)
                # 8 stream on the off backend's 8 slots; the other 8, pinned there too, wait
                # in the proxy's queue (no answer head yet) for a slot of their profile.
                posts = [
                    asyncio.create_task(
                        c.post(
                            faulty_proxy.url + PATHS["chat"],
                            json=body_for("chat"),
                            headers={"X-MTP-Profile": "off", "X-Request-Id": request_id},
                        )
                    )
                    for c, request_id in zip(clients, ids, strict=True)
                ]
                deadline = time.monotonic() + 5.0
                while await busy_slots(probe, ports["off"]) < 8 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert await busy_slots(probe, ports["off"]) == 8
                while sum(p.done() for p in posts) < 8 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                for post in posts:  # the storm: every client goes away, mid-stream or queued
                    if post.done():
                        post.result().close()
                    else:
                        post.cancel()
                await asyncio.gather(*posts, return_exceptions=True)
            for profile in ("off", "min"):
                await wait_idle(faulty_proxy, f"mtp-demo/{profile}")
                deadline = time.monotonic() + 2.0
                while await busy_slots(probe, ports[profile]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert await busy_slots(probe, ports[profile]) == 0, f"{profile} slots still busy"
    # Every abandoned request, streaming or still queued, is logged with nginx's 499.
    deadline = time.monotonic() + 2.0
    while client_closed_lines(faulty_proxy, request_ids) < 48 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert client_closed_lines(faulty_proxy, request_ids) == 48

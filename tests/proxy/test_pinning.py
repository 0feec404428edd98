"""A pinned request (X-MTP-Profile) goes to its profile even when that profile (and every
other) is full: the proxy neither queues it nor sends it elsewhere."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]
OTHER = [{"role": "user", "content": "And what about harbours?"}]  # another session


async def test_a_pinned_request_waits_for_a_slot_of_its_profile(tmp_path: Path) -> None:
    """A pin is admitted like any request: to a full profile it is neither
    forwarded past the backend's slots nor sent elsewhere; it waits for that profile's slot."""
    model = simulator_model(slots=1, time_scale=2.0)
    with running_proxy(proxy_config([model]), tmp_path) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 3})
        url = proxy.url + "/v1/chat/completions"
        pin = {"X-MTP-Profile": "max"}
        async with aiohttp.ClientSession() as session:
            first = await session.post(
                url, json={"messages": CHAT, "max_tokens": 200, "stream": True}, headers=pin
            )
            assert first.headers["X-MTP-Profile"] == "max"
            await first.content.readany()  # max's only slot is busy now
            first_chunks = asyncio.create_task(arrivals(first))
            second = asyncio.create_task(
                session.post(url, json={"messages": OTHER, "max_tokens": 4}, headers=pin)
            )
            # off and min are free, yet the pinned request waits: max never gets a second one
            # while the first stream runs.
            for _ in range(20):
                await asyncio.sleep(0.05)
                assert in_flight(proxy, "mtp-demo/max") == 1
                assert not second.done()
            chunks = await asyncio.wait_for(first_chunks, 60)
            first.release()
            response = await asyncio.wait_for(second, 30)
            answered_at = time.perf_counter()
            assert response.status == 200
            assert response.headers["X-MTP-Profile"] == "max"
            assert response.headers["X-MTP-Route-Reason"] == "pinned"
            await response.read()
            response.release()
    assert chunks and answered_at > chunks[-1][0], "the pinned request overtook the first stream"


def in_flight(proxy: ProxyProcess, backend: str) -> int:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return int({row["name"]: row["in_flight"] for row in rows}[backend])


async def wait_in_flight(proxy: ProxyProcess, backend: str, count: int) -> float:
    """When the proxy first counts `count` requests in flight on `backend` (bounded wait)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
        if {row["name"]: row["in_flight"] for row in rows}[backend] >= count:
            return time.perf_counter()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{backend} never had {count} requests in flight")


async def arrivals(response: aiohttp.ClientResponse) -> list[tuple[float, bytes]]:
    """Every chunk of a stream with the time it arrived, until its end."""
    chunks = []
    async for data in response.content.iter_any():
        chunks.append((time.perf_counter(), data))
    return chunks


async def test_an_unknown_pin_is_a_400_naming_the_profiles(demo_proxy: ProxyProcess) -> None:
    """A typo in the pin header (`X-MTP-Profile: turbo`) used to be routed as if unpinned, a
    silent 200: now a 400 in the called API's error shape, naming the model's profiles."""
    pin = {"X-MTP-Profile": "turbo"}
    body = {"messages": CHAT, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            demo_proxy.url + "/v1/chat/completions", json=body, headers=pin
        ) as openai:
            openai_error = (openai.status, await openai.json())
        async with session.post(
            demo_proxy.url + "/v1/messages", json={**body, "model": "mtp-demo"}, headers=pin
        ) as anthropic:
            anthropic_error = (anthropic.status, await anthropic.json())
    message = (
        "unknown profile 'turbo' in the X-MTP-Profile header: model mtp-demo has the profiles "
        "off, min, max"
    )
    assert openai_error[0] == 400
    assert openai_error[1]["error"]["message"] == message
    assert openai_error[1]["error"]["code"] == "unknown_profile"
    assert anthropic_error == (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )

"""A pinned request (X-MTP-Profile) goes to its profile even when that profile is full."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.harness import proxy_config, running_proxy, simulator_model, wait_all_ready

CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]
OTHER = [{"role": "user", "content": "And what about harbours?"}]  # another session


async def test_a_pinned_request_goes_to_its_profile_even_when_full(tmp_path: Path) -> None:
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
            second = asyncio.create_task(
                session.post(url, json={"messages": OTHER, "max_tokens": 4}, headers=pin)
            )
            response = await asyncio.wait_for(second, 30)
            assert response.status == 200
            assert not first.content.at_eof(), "the first stream should still be running"
            assert response.headers["X-MTP-Profile"] == "max"
            assert response.headers["X-MTP-Route-Reason"] == "pinned"
            response.release()
            await first.read()
            first.release()

"""What one client can do to what every client shares, on a real proxy: pinned requests go
through the queue (429 past it), crafted prompts barely move the learned chars-per-token, and
invented session ids do not grow the session table past its bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.load import paced_preset, simulator_args
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import watch_in_flight

MAX_QUEUE = 2
MAX_SESSIONS = 50


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("shared")
    paced = {
        "name": "paced",
        "backend": "simulator",
        "draft_control": "per-process",  # pins choose a backend here: a pool of two
        "args": simulator_args(paced_preset(workdir, 50.0), 1),  # one slot per backend
        "profiles": [{"name": "off"}, {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}],
    }
    config = proxy_config(
        [simulator_model(), paced],
        server={"max_queue": MAX_QUEUE, "queue_timeout_s": 20.0},
        routing={"max_sessions": MAX_SESSIONS},
    )
    with running_proxy(config, workdir / "proxy") as proxy:
        # /health is 200 from the first ready backend on: a pin to a backend not ready yet
        # would be routed as if unpinned.
        wait_all_ready(proxy, {"mtp-demo": 3, "paced": 2})
        yield proxy


async def post(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str]]:
    async with session.post(
        proxy.url + "/v1/chat/completions", json=body, headers=headers or {}
    ) as response:
        await response.read()
        return response.status, dict(response.headers)


async def test_pinned_requests_queue_and_get_429_past_the_queue(shared: ProxyProcess) -> None:
    body = {
        "model": "paced",
        "messages": [{"role": "user", "content": "pinned"}],
        "max_tokens": 50,  # 1 s each at 50 tok/s: the 8 arrive while the first is served
        "ignore_eos": True,
    }
    seen: dict[str, int] = {}
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch_in_flight(shared, seen, stop))
        outcomes = await asyncio.gather(
            *(post(session, shared, body, {"X-MTP-Profile": "max"}) for _ in range(8))
        )
        stop.set()
        await watcher
    statuses = sorted(status for status, _ in outcomes)
    assert statuses.count(429) >= 1, statuses  # past one slot and MAX_QUEUE waiting
    assert set(statuses) <= {200, 429}
    assert seen["paced/max"] <= 1  # never past the backend's one slot
    served = [headers for status, headers in outcomes if status == 200]
    assert served and all(h["X-MTP-Profile"] == "max" for h in served)


async def est_tokens_of(proxy: ProxyProcess, session: aiohttp.ClientSession, text: str) -> int:
    marker = f"probe-{len(text)}-{text[:8]}"
    body = {"model": "mtp-demo", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    await post(session, proxy, body, {"X-MTP-Session": marker})
    flushed(proxy)
    for line in reversed(proxy.log_lines()):
        if line.get("event") == "request" and line.get("est_prompt_tokens") is not None:
            return int(line["est_prompt_tokens"])
    raise AssertionError("no request line")


def flushed(proxy: ProxyProcess) -> None:
    """/admin/routing runs the deferred bookkeeping first: every answered request is logged
    and learned from once it answers."""
    assert proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[0] == 200


async def test_crafted_prompts_barely_move_the_shared_token_estimate(shared: ProxyProcess) -> None:
    normal = "Please review this function and explain what it does, step by step. " * 60
    tiny_messages = [{"role": "user", "content": "x"}] * 10_000
    async with aiohttp.ClientSession() as session:
        before = await est_tokens_of(shared, session, normal)
        for _ in range(10):
            crafted = {"model": "mtp-demo", "messages": tiny_messages, "max_tokens": 1}
            status, _ = await post(session, shared, crafted)
            assert status == 200
        after = await est_tokens_of(shared, session, normal)  # their observations flushed first
    assert after <= before * 1.11, (before, after)  # it was 3.5x after ten such requests


async def test_invented_session_ids_are_bounded_oldest_out(shared: ProxyProcess) -> None:
    body = {"model": "mtp-demo", "messages": [{"role": "user", "content": "s"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        for n in range(MAX_SESSIONS * 4):
            status, _ = await post(session, shared, body, {"X-MTP-Session": f"s{n:04d}" * 60})
            assert status == 200
    _, routing = shared.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert MAX_SESSIONS // 2 <= routing["sessions"] <= MAX_SESSIONS, json.dumps(routing)[:300]

"""Routing reasons as a client sees them: `X-MTP-Route-Reason` from a real proxy.

Three simulated backends (off, min, max) with one slot each, so that one long stream makes a
backend full. Exploration is off unless a test turns it on, so each decision is deterministic:
a short chat that nothing is known about goes to `max` by the cold rule (reason `rule`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    wait_all_ready,
)

QUIET = {"exploration_rate": 0.0, "cold_exploration_rate": 0.0, "seed": 1}


def chat(text: str, *, max_tokens: int = 8, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "mtp-demo",
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


@contextmanager
def start(tmp_path: Path, routing: dict[str, Any]) -> Iterator[ProxyProcess]:
    model = simulator_model(slots=1, time_scale=2.0)
    with running_proxy(proxy_config([model], routing=routing), tmp_path) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 3})
        yield proxy


@pytest.fixture(scope="module")
def quiet_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with start(tmp_path_factory.mktemp("reasons"), QUIET) as proxy:
        yield proxy


async def post(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[str, str, str]:
    """(reason, profile, backend) of one complete answer."""
    async with session.post(
        proxy.url + "/v1/chat/completions", json=body, headers=headers or {}
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()
        h = response.headers
        return h["X-MTP-Route-Reason"], h["X-MTP-Profile"], h["X-MTP-Backend"]


async def test_a_session_header_keeps_a_session_on_its_backend(quiet_proxy: ProxyProcess) -> None:
    session_header = {"X-MTP-Session": "agent-run-1"}
    async with aiohttp.ClientSession() as session:
        first = await post(session, quiet_proxy, chat("Rename x to y"), session_header)
        assert first[:2] == ("rule", "max")
        # Another first turn, same header: the header alone names the session.
        again = await post(session, quiet_proxy, chat("Now add a test"), session_header)
        assert again == ("affinity", "max", first[2])
        other = await post(
            session, quiet_proxy, chat("Now add a test"), {"X-MTP-Session": "agent-run-2"}
        )
        assert other[:2] == ("rule", "max")  # a new session: no cache to stay with


async def test_a_session_whose_backend_is_full_spills_to_another_profile(
    quiet_proxy: ProxyProcess,
) -> None:
    agent = {"X-MTP-Session": "agent-run-3"}
    await idle(quiet_proxy)
    async with aiohttp.ClientSession() as session:
        # The agent's long turn takes max's only slot (and keeps its cache there).
        long = await session.post(
            quiet_proxy.url + "/v1/chat/completions",
            json=chat("Write the whole module", max_tokens=400, stream=True),
            headers=agent,
        )
        try:
            assert long.headers["X-MTP-Route-Reason"] == "rule"
            assert long.headers["X-MTP-Profile"] == "max"
            await long.content.readany()
            assert in_flight(quiet_proxy)["mtp-demo/max"] == 1  # full until the turn ends
            # A parallel request of the same session (a sub-agent, a title): queueing behind
            # the long turn costs more than reading its short prompt elsewhere.
            reason, profile, _ = await post(session, quiet_proxy, chat("Name this chat"), agent)
            assert (reason, profile != "max") == ("spill", True), (reason, profile)
        finally:
            long.close()


async def test_a_full_backend_is_no_candidate_for_a_new_session(quiet_proxy: ProxyProcess) -> None:
    await idle(quiet_proxy)
    async with aiohttp.ClientSession() as session:
        long = await session.post(
            quiet_proxy.url + "/v1/chat/completions",
            json=chat("Tell me a long story", max_tokens=400, stream=True),
            headers={"X-MTP-Profile": "max"},
        )
        try:
            await long.content.readany()
            assert in_flight(quiet_proxy)["mtp-demo/max"] == 1
            # The cold rule's max is full: the next in its fallback order serves, not a queue.
            reason, profile, _ = await post(session, quiet_proxy, chat("What is a quay?"))
            assert (reason, profile) == ("fallback", "min")
        finally:
            long.close()


async def idle(proxy: ProxyProcess, timeout: float = 5.0) -> None:
    """Until no request is in flight (an earlier test's cut stream is let go first)."""
    deadline = time.monotonic() + timeout
    while any(in_flight(proxy).values()):
        assert time.monotonic() < deadline, in_flight(proxy)
        await asyncio.sleep(0.02)


def in_flight(proxy: ProxyProcess) -> dict[str, int]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return {row["name"]: row["in_flight"] for row in rows}


async def test_a_cold_class_explores_an_untried_profile(tmp_path: Path) -> None:
    # cold_exploration_rate 1: every placement by the cold rules tries an untried profile.
    with start(tmp_path, {**QUIET, "cold_exploration_rate": 1.0}) as proxy:
        async with aiohttp.ClientSession() as session:
            reason, profile, _ = await post(session, proxy, chat("What is a lighthouse?"))
        assert reason == "explore"
        assert profile in {"off", "min"}  # not max, the cold rule's pick for a short chat

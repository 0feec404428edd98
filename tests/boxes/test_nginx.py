"""Debian's nginx in front of two mtp-proxy boxes with the shipped deploy/balancers/nginx.conf
(`hash $http_x_mtp_session consistent`): each session stays on one box, sessions spread over
both, and with one box killed its sessions move to the other; a stream in flight on the dead
box is cut (no [DONE]: the client sees a broken transfer)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.boxes import MODEL, Balancer, behind, kill
from tests.support.harness import ProxyProcess

CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]
# Odd, so that round robin would move them; 15, so that a hash ring that favours one box
# still puts a session on the other (seven all landed on one box in one run in a hundred).
SESSIONS = [f"session-{n}" for n in range(15)]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Balancer, list[ProxyProcess]]]:
    with behind("nginx", tmp_path_factory.mktemp("nginx")) as running:
        yield running


async def chat(
    session: aiohttp.ClientSession,
    balancer: Balancer,
    key: str,
    *,
    tokens: int = 4,
    stream: bool = False,
) -> tuple[int, str, bytes]:
    """(status, the box's address nginx says served it, the body; -1: the transfer broke)."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": tokens, "stream": stream}
    try:
        async with session.post(
            balancer.url + "/v1/chat/completions", json=body, headers={"X-MTP-Session": key}
        ) as response:
            # nginx lists every upstream it tried ("dead, alive" after a kill): the last answered.
            served = response.headers.get("X-Served-By", "").split(",")[-1].strip()
            return response.status, served, await response.read()
    except aiohttp.ClientPayloadError as exc:
        return -1, "", str(exc).encode()


def served_by(balancer: Balancer, rounds: int = 3) -> dict[str, set[str]]:
    async def ask() -> dict[str, set[str]]:
        seen: dict[str, set[str]] = {}
        async with aiohttp.ClientSession() as session:
            for _ in range(rounds):
                for key in SESSIONS:
                    status, box, raw = await chat(session, balancer, key)
                    assert status == 200, raw
                    seen.setdefault(key, set()).add(box)
        return seen

    return asyncio.run(ask())


def test_each_session_stays_on_one_box_and_sessions_spread(
    stack: tuple[Balancer, list[ProxyProcess]],
) -> None:
    balancer, boxes = stack
    seen = served_by(balancer)
    assert all(len(where) == 1 for where in seen.values()), seen
    addresses = {f"127.0.0.1:{box.port}" for box in boxes}
    assert set().union(*seen.values()) == addresses  # both boxes hold sessions


def test_a_killed_boxs_sessions_move_to_the_other(
    stack: tuple[Balancer, list[ProxyProcess]],
) -> None:
    balancer, boxes = stack
    before = served_by(balancer, rounds=1)
    dead = f"127.0.0.1:{boxes[1].port}"
    on_dead = next(key for key, where in before.items() if where == {dead})

    async def cut() -> tuple[int, str, bytes]:
        async with aiohttp.ClientSession() as session:
            streaming = asyncio.create_task(
                chat(session, balancer, on_dead, tokens=400, stream=True)
            )
            while (await asyncio.to_thread(boxes[1].get_json, "/health"))[1]["models"][MODEL][
                "slots_busy"
            ] == 0:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(kill, boxes[1])
            return await streaming

    status, _, raw = asyncio.run(cut())
    assert status == -1 or not raw.rstrip().endswith(b"[DONE]"), raw[-200:]
    after = served_by(balancer)
    assert set().union(*after.values()) == {f"127.0.0.1:{boxes[0].port}"}

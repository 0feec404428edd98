"""LiteLLM's proxy server (pinned, .balancers/litellm) in front of two mtp-proxy boxes, with the
shipped deploy/balancers/litellm.yaml: requests spread over both boxes, a session stays on one
(LiteLLM's own session affinity, keyed by the agent's session header), and with one box killed
the other takes the load; only the requests in flight on the dead box fail, with an error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.boxes import MODEL, Balancer, behind, kill
from tests.support.harness import ProxyProcess

CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Balancer, list[ProxyProcess]]]:
    with behind("litellm", tmp_path_factory.mktemp("litellm")) as running:
        yield running


async def chat(
    session: aiohttp.ClientSession,
    balancer: Balancer,
    *,
    tokens: int = 8,
    stream: bool = False,
    headers: dict[str, str] | None = None,
) -> tuple[int, str, bytes]:
    """(status, the box that answered per LiteLLM's x-litellm-model-id, the body)."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": tokens, "stream": stream}
    auth = {"Authorization": f"Bearer {balancer.key}", **(headers or {})}
    try:
        async with session.post(
            balancer.url + "/v1/chat/completions", json=body, headers=auth
        ) as response:
            raw = await response.read()
            return response.status, response.headers.get("x-litellm-model-id", ""), raw
    except aiohttp.ClientPayloadError as exc:  # the stream cut without its end
        return -1, "", str(exc).encode()


def agent(n: int) -> dict[str, str]:
    return {"x-claude-code-session-id": f"agent-session-{n:08d}"}


def run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def test_requests_spread_over_both_boxes(stack: tuple[Balancer, list[ProxyProcess]]) -> None:
    balancer, boxes = stack

    async def burst() -> list[tuple[int, str, bytes]]:
        async with aiohttp.ClientSession() as session:
            # Agents' sessions, each new one sent once the one before is in flight: least-busy
            # places it on the box with fewer (LiteLLM counts a request in flight only once
            # it left, so a burst sent at once all lands on the first box).
            sent = []
            for n in range(4):
                sent.append(
                    asyncio.create_task(chat(session, balancer, tokens=80, headers=agent(n)))
                )
                await until_busy(boxes, at_least=n + 1)
            return await asyncio.gather(*sent)

    answers = run(burst())
    assert [a[0] for a in answers] == [200] * 4, answers  # type: ignore[index]
    assert {a[1] for a in answers} == {"box-1", "box-2"}  # type: ignore[index]


def test_a_session_stays_on_one_box(stack: tuple[Balancer, list[ProxyProcess]]) -> None:
    """Each session's next turn is sent while its box carries more streams from this LiteLLM
    than the other: least-busy alone would move it; session affinity keeps it."""
    balancer, _ = stack

    async def sessions() -> dict[str, list[str]]:
        served: dict[str, list[str]] = {}
        async with aiohttp.ClientSession() as session:
            for n, name in enumerate(("e96634a3-fa28-4083-b354-55542e2dca01", "0b1c2d3e4f5a6b7c")):
                headers = {"x-claude-code-session-id": name}
                status, first, raw = await chat(session, balancer, headers=headers)
                assert status == 200, raw
                held = await load_more(session, balancer, first, 200 + 10 * n)
                status, box, raw = await chat(session, balancer, headers=headers)
                assert status == 200, raw
                served[name] = [first, box]
                for response in held:
                    response.close()
        return served

    served = run(sessions())
    assert all(a == b for a, b in served.values()), served  # type: ignore[union-attr]


async def load_more(
    session: aiohttp.ClientSession, balancer: Balancer, box: str, first: int
) -> list[aiohttp.ClientResponse]:
    """Open long streams through LiteLLM (new sessions) until ``box`` carries more of them
    than the other box; the open responses (close them to end the load)."""
    held: list[aiohttp.ClientResponse] = []
    on: dict[str, int] = {"box-1": 0, "box-2": 0}
    while on[box] <= min(on.values()) and len(held) < 6:
        body = {"model": MODEL, "messages": CHAT, "max_tokens": 400, "stream": True}
        auth = {"Authorization": f"Bearer {balancer.key}", **agent(first + len(held))}
        response = await session.post(
            balancer.url + "/v1/chat/completions", json=body, headers=auth
        )
        held.append(response)
        on[response.headers["x-litellm-model-id"]] += 1
    assert on[box] > min(on.values()), on
    return held


def test_a_killed_box_fails_only_its_requests_in_flight(
    stack: tuple[Balancer, list[ProxyProcess]],
) -> None:
    balancer, boxes = stack

    async def scenario() -> tuple[list[tuple[int, str, bytes]], list[tuple[int, str, bytes]]]:
        async with aiohttp.ClientSession() as session:
            # Long streams, one at a time until both boxes serve one (least-busy sends each new
            # session to the box with fewer in flight).
            long = []
            for n in range(8):
                long.append(
                    asyncio.create_task(
                        chat(session, balancer, tokens=400, stream=True, headers=agent(100 + n))
                    )
                )
                busy = await until_busy(boxes, at_least=sum(1 for _ in long))
                if all(busy):
                    break
            await asyncio.to_thread(kill, boxes[1])
            in_flight = await asyncio.gather(*long)
            after = [await chat(session, balancer, tokens=4) for _ in range(6)]
        return in_flight, after

    in_flight, after = run(scenario())  # type: ignore[misc]
    assert [a[0] for a in after] == [200] * 6, after  # nothing lost after the kill
    assert {a[1] for a in after} == {"box-1"}
    finished = [a for a in in_flight if a[0] == 200 and a[2].rstrip().endswith(b"[DONE]")]
    failed = [a for a in in_flight if a not in finished]
    assert finished and failed, in_flight  # box-1's finished, box-2's did not
    for status, box, raw in failed:
        assert box == "box-2", (status, box)
        if status == 200:
            # The stream had begun: LiteLLM ends it with an error event (APIConnectionError)
            # and no [DONE], so the client knows the answer is cut.
            last = raw.rstrip().rsplit(b"\n\n", 1)[-1]
            assert last.startswith(b'data: {"error"') and b"APIConnectionError" in last, raw
        else:  # not begun yet: an error answer in OpenAI's shape
            assert status >= 500 and "message" in json.loads(raw)["error"], (status, raw)


async def until_busy(boxes: list[ProxyProcess], at_least: int, timeout: float = 30.0) -> list[bool]:
    """Whether each box serves a request, once the boxes serve ``at_least`` in all: an event
    read from each box's /health."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        loads = [await asyncio.to_thread(box.get_json, "/health") for box in boxes]
        busy = [body["models"][MODEL]["slots_busy"] for _, body in loads]
        if sum(busy) >= at_least:
            return [n > 0 for n in busy]
        if loop.time() > deadline:
            raise AssertionError(f"not {at_least} busy: {json.dumps([b for _, b in loads])}")
        await asyncio.sleep(0.05)


def test_the_shipped_config_is_the_one_run() -> None:
    text = (Path(__file__).resolve().parents[2] / "deploy/balancers/litellm.yaml").read_text()
    assert "session_affinity" in text and "least-busy" in text

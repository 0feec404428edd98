"""What a balancer reads of a real proxy: /health's load view (503 while every slot is busy), the
vLLM-named gauges with live values, and the depth and speculative type every answer carries.

`pool`: three simulated processes (off, min at depth 2, max at depth 3) of one slot each, decoding
at a flat 20 tokens/s (bench.load's paced preset), so a request of N tokens holds its slot N/20 s.
`one`: one process serving the depths per request, with both balancer settings turned off.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.load import paced_preset
from tests.support.harness import (
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

TOK_S = 20.0
CHAT = [{"role": "user", "content": "Tell me about lighthouses."}]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("load-view")
    preset = paced_preset(workdir, TOK_S)
    model = simulator_model(preset=str(preset), time_scale=1.0, slots=1)
    server = {"max_queue": 8, "queue_timeout_s": 30.0}
    with running_proxy(proxy_config([model], server=server), workdir / "proxy") as proxy:
        wait_all_ready(proxy, {"mtp-demo": 3})
        yield proxy


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("load-view-one")
    preset = paced_preset(workdir, TOK_S)
    model = simulator_model(
        preset=str(preset), time_scale=1.0, slots=1, draft_control="per-request"
    )
    server = {"health_unavailable_when_full": False, "vllm_metrics": False}
    with running_proxy(proxy_config([model], server=server), workdir / "proxy") as proxy:
        yield proxy


def metric(proxy: ProxyProcess, name: str, model: str) -> float | None:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll the proxy until `condition` holds (bounded): an event, not a guess."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(condition):
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


async def generate(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    *,
    tokens: int,
    stream: bool,
    pin: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    body = {
        "model": "mtp-demo",
        "messages": CHAT,
        "max_tokens": tokens,
        "stream": stream,
        "ignore_eos": True,
    }
    headers = {"X-MTP-Profile": pin} if pin else {}
    async with session.post(
        proxy.url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        raw = await response.read()
        return response.status, dict(response.headers), raw


def test_health_shows_each_models_slots_and_answers_503_while_all_are_busy(
    pool: ProxyProcess,
) -> None:
    status, idle = pool.get_json("/health")
    assert status == 200 and idle["status"] == "ok"
    assert idle["ready_backends"] == {"mtp-demo": 3}  # what readers of /health read before
    assert idle["models"]["mtp-demo"] == {
        "ready_backends": 3,
        "slots_total": 3,
        "slots_busy": 0,
        "slots_free": 3,
        "requests_waiting": 0,
    }
    assert metric(pool, "vllm:num_requests_running", "mtp-demo") == 0
    assert metric(pool, "vllm:num_requests_waiting", "mtp-demo") == 0

    async def fill() -> None:
        async with aiohttp.ClientSession() as session:
            # One per process (pinned: each holds its own slot), then one that must wait.
            held = [
                asyncio.create_task(generate(session, pool, tokens=60, stream=True, pin=p))
                for p in ("off", "min", "max")
            ]
            await until("every slot busy", lambda: pool.get_json("/health")[0] == 503)
            waiting = asyncio.create_task(generate(session, pool, tokens=2, stream=False))
            await until(
                "one waiting",
                lambda: pool.get_json("/health")[1]["models"]["mtp-demo"]["requests_waiting"] == 1,
            )
            status, full = pool.get_json("/health")
            assert status == 503 and full["status"] == "full", full
            assert full["models"]["mtp-demo"]["slots_busy"] == 3
            assert full["models"]["mtp-demo"]["slots_free"] == 0
            assert metric(pool, "vllm:num_requests_running", "mtp-demo") == 3
            assert metric(pool, "vllm:num_requests_waiting", "mtp-demo") == 1
            answers = await asyncio.gather(*held, waiting)
            assert [a[0] for a in answers] == [200] * 4

    asyncio.run(fill())
    assert pool.get_json("/health")[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_every_answer_carries_its_depth_and_speculative_type(
    pool: ProxyProcess, stream: bool
) -> None:
    async def ask() -> dict[str, tuple[str, str, str]]:
        seen = {}
        async with aiohttp.ClientSession() as session:
            for pin in ("off", "min", "max"):
                status, headers, _ = await generate(session, pool, tokens=4, stream=stream, pin=pin)
                assert status == 200
                seen[pin] = (
                    headers["X-MTP-Profile"],
                    headers["X-MTP-Depth"],
                    headers["X-MTP-Spec-Type"],
                )
        return seen

    seen = asyncio.run(ask())
    assert seen == {
        "off": ("off", "0", "none"),
        "min": ("min", "2", "draft-mtp"),
        "max": ("max", "3", "draft-mtp"),
    }


def test_one_process_answers_carry_the_per_request_depth(one: ProxyProcess) -> None:
    async def ask() -> dict[str, tuple[str, str]]:
        seen = {}
        async with aiohttp.ClientSession() as session:
            for pin in ("off", "min", "max"):
                status, headers, raw = await generate(session, one, tokens=4, stream=True, pin=pin)
                assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
                seen[pin] = (headers["X-MTP-Depth"], headers["X-MTP-Spec-Type"])
        return seen

    # One process drafts with draft-mtp whatever the depth; depth 0 is the request's own.
    assert asyncio.run(ask()) == {
        "off": ("0", "draft-mtp"),
        "min": ("2", "draft-mtp"),
        "max": ("3", "draft-mtp"),
    }


def test_the_balancer_settings_turn_off(one: ProxyProcess) -> None:
    async def hold() -> None:
        async with aiohttp.ClientSession() as session:
            held = asyncio.create_task(generate(session, one, tokens=40, stream=True))
            await until(
                "its one slot busy",
                lambda: one.get_json("/health")[1]["models"]["mtp-demo"]["slots_free"] == 0,
            )
            status, health = one.get_json("/health")
            assert status == 200 and health["status"] == "ok"  # full, but the setting is off
            with urllib.request.urlopen(one.url + "/metrics", timeout=10) as response:
                assert "vllm:" not in response.read().decode()
            assert (await held)[0] == 200

    asyncio.run(hold())
    status, body = one.get_json("/health")
    assert status == 200 and json.dumps(body)

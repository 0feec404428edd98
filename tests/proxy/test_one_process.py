"""One process per model, profiles as per-request depths, through the real proxy on a simulator.

The simulator honours "speculative.n_max" as the patched llama-server does; its /metrics counts
draft tokens and verification steps per position, which tells the depth a request drafted at.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

MODEL = "mtp-demo"
BACKEND = "mtp-demo/one-process"
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "one", "spec_type": "draft-mtp", "draft_n_max": 1},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]
DEPTH = {"off": 0, "one": 1, "min": 2, "max": 3}
NO_EXPLORE = {"seed": 1, "exploration_rate": 0.0, "cold_exploration_rate": 0.0}
SHORT = "Tell me about lighthouses and the people who kept them."


def body(api: str, text: str, max_tokens: int = 48) -> dict[str, Any]:
    if api == "completions":
        return {"model": MODEL, "prompt": text, "max_tokens": max_tokens}
    if api == "responses":
        return {"model": MODEL, "input": text, "max_output_tokens": max_tokens}
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }


PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}


def one_process_proxy(workdir: Path, state_file: Path | None = None) -> Iterator[ProxyProcess]:
    model = simulator_model(
        draft_control="per-request", profiles=PROFILES, slots=4, time_scale=50.0
    )
    routing = NO_EXPLORE if state_file is None else {**NO_EXPLORE, "learned_file": str(state_file)}
    config = proxy_config([model], routing=routing)
    with running_proxy(config, workdir) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        yield proxy


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    yield from one_process_proxy(tmp_path_factory.mktemp("one-process"))


@pytest.fixture
def fresh_one_process(tmp_path: Path) -> Iterator[ProxyProcess]:
    """One with nothing learned yet: the cold rules decide."""
    yield from one_process_proxy(tmp_path)


def backend_row(proxy: ProxyProcess) -> dict[str, Any]:
    status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200
    return next(row for row in payload["backends"] if row["name"] == BACKEND)


async def draft_counters(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    """The backend's own draft counters: tokens, verification steps, accepted per position."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            pos = sample.labels.get("pos") or sample.labels.get("position")
            key = sample.name.removeprefix("llamacpp:") + (f"@{pos}" if pos is not None else "")
            out[key] = sample.value
    return out


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


async def send(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    api: str,
    text: str,
    *,
    pin: str | None = None,
    max_tokens: int = 48,
) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
    headers = {"X-MTP-Profile": pin} if pin else {}
    async with session.post(
        proxy.url + PATHS[api], json=body(api, text, max_tokens), headers=headers
    ) as response:
        payload = await response.json()
        assert response.status == 200, payload
        return response, payload


async def test_pins_give_each_depth_through_all_four_apis(one_process: ProxyProcess) -> None:
    port = backend_row(one_process)["port"]
    async with aiohttp.ClientSession() as session:
        for api in PATHS:
            for profile, depth in DEPTH.items():
                before = await draft_counters(session, port)
                response, payload = await send(
                    session, one_process, api, f"{SHORT} ({api} {profile})", pin=profile
                )
                after = await draft_counters(session, port)
                assert response.headers["X-MTP-Profile"] == profile
                assert response.headers["X-MTP-Route-Reason"] == "pinned"
                assert response.headers["X-MTP-Backend"] == BACKEND
                tokens = delta(after, before, "spec_decode_num_draft_tokens_total")
                steps = delta(after, before, "spec_decode_num_drafts_total")
                where = f"{api} at {profile}"
                if depth == 0:
                    assert (tokens, steps) == (0, 0), where
                else:
                    assert 0 < tokens <= depth * steps, where
                    if depth == 1:
                        assert tokens == steps, where
                timings = payload.get("timings")
                if api in ("chat", "completions"):
                    assert timings is not None, where
                    assert ("draft_n" in timings) == (depth > 0), where
                    if depth:
                        assert timings["draft_n"] == tokens, where


async def test_the_deepest_profile_drafts_deeper_than_the_next(one_process: ProxyProcess) -> None:
    """max (3) is not clamped to min (2): over a long answer some third draft tokens are
    accepted at max, none at min (the backend counts accepted tokens per draft position)."""
    port = backend_row(one_process)["port"]
    third = "spec_decode_num_accepted_tokens_per_pos_total@2"
    async with aiohttp.ClientSession() as session:
        accepted_third = {}
        for profile in ("min", "max"):
            before = await draft_counters(session, port)
            text = f"{SHORT} deep {profile}"
            await send(session, one_process, "chat", text, pin=profile, max_tokens=300)
            after = await draft_counters(session, port)
            accepted_third[profile] = delta(after, before, third)
        assert accepted_third["min"] == 0 < accepted_third["max"], accepted_third


async def test_a_client_that_sets_the_depth_keeps_it(one_process: ProxyProcess) -> None:
    """It runs at its own depth, and is labelled, leased and learned as the profile of that
    depth, not as the profile it was routed to; a depth no profile has is labelled "client" and
    not learned. (The simulator, like llama-server's parser, takes the last of duplicate keys:
    the depth would be the client's even if the proxy added its own first.)"""
    port = backend_row(one_process)["port"]
    prose = " ".join([SHORT] * 400)  # ~6k tokens: a class no other request here falls in
    async with aiohttp.ClientSession() as session:
        await send(session, one_process, "chat", f"{SHORT} learned", pin="max")  # is learned
        before = await draft_counters(session, port)
        request = {**body("chat", prose, 64), "speculative.n_max": 1}
        headers = {"X-MTP-Profile": "max"}
        async with session.post(
            one_process.url + PATHS["chat"], json=request, headers=headers
        ) as response:
            assert response.status == 200
            labels = (response.headers["X-MTP-Profile"], response.headers["X-MTP-Route-Reason"])
        after = await draft_counters(session, port)
        odd = {**body("chat", f"{prose} odd", 64), "speculative.n_max": 2**20}
        async with session.post(one_process.url + PATHS["chat"], json=odd) as response:
            assert response.status == 200
            odd_label = response.headers["X-MTP-Profile"]
    tokens = delta(after, before, "spec_decode_num_draft_tokens_total")
    steps = delta(after, before, "spec_decode_num_drafts_total")
    assert 0 < tokens == steps  # depth 1: one draft token per step, not max's 3
    assert labels == ("one", "client") and odd_label == "client"
    status, routing = one_process.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    rows = {(r["request_class"], r["profile"]) for r in routing["learned"]}
    assert any(c.startswith("4k-16k/") and p == "one" for c, p in rows), rows  # what it ran at
    assert not any(c.startswith("4k-16k/") and p != "one" for c, p in rows), rows


async def test_infill_is_routed_with_a_depth(one_process: ProxyProcess) -> None:
    """/infill generates: it gets the depth of its route like a completion (forwarded as it
    was, it ran at the process's start-up depth, 3, whatever the profile said)."""
    port = backend_row(one_process)["port"]
    infill = {
        "model": MODEL,
        "input_prefix": "def add(a, b):\n    ",
        "input_suffix": "\n\nprint(add(1, 2))\n",
        "n_predict": 48,
    }
    drafted = {}
    async with aiohttp.ClientSession() as session:
        for pin in ("off", "one"):
            before = await draft_counters(session, port)
            async with session.post(
                one_process.url + "/infill", json=infill, headers={"X-MTP-Profile": pin}
            ) as response:
                assert response.status == 200, await response.text()
                assert response.headers["X-MTP-Profile"] == pin
                assert (await response.json())["content"]
            after = await draft_counters(session, port)
            tokens = delta(after, before, "spec_decode_num_draft_tokens_total")
            drafted[pin] = (tokens, delta(after, before, "spec_decode_num_drafts_total"))
    assert drafted["off"] == (0, 0)
    assert 0 < drafted["one"][0] == drafted["one"][1]  # depth 1: one draft token per step


async def test_unpinned_requests_get_the_depth_of_their_class(
    fresh_one_process: ProxyProcess,
) -> None:
    one_process = fresh_one_process
    long_code = "def handler(request):\n    return compute(request.body)\n" * 2500  # ~40k tok
    async with aiohttp.ClientSession() as session:
        short, _ = await send(session, one_process, "chat", f"{SHORT} unpinned")
        assert (short.headers["X-MTP-Profile"], short.headers["X-MTP-Route-Reason"]) == (
            "max",
            "rule",
        )
        code, _ = await send(session, one_process, "chat", long_code, max_tokens=8)
        assert code.headers["X-MTP-Profile"] == "min"
        assert code.headers["X-MTP-Backend"] == BACKEND


async def test_a_killed_process_makes_requests_wait_not_fail(tmp_path: Path) -> None:
    model = simulator_model(draft_control="per-request", slots=4, time_scale=5.0)
    supervisor = {"backoff_initial_s": 0.3, "health_interval_s": 0.2}
    config = proxy_config([model], routing=NO_EXPLORE, supervisor=supervisor)
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        pid = backend_row(proxy)["pid"]
        async with aiohttp.ClientSession() as session:

            async def one(n: int) -> int:
                async with session.post(
                    proxy.url + "/v1/chat/completions", json=body("chat", f"{SHORT} {n}", 32)
                ) as response:
                    await response.read()
                    return response.status

            requests = [asyncio.create_task(one(n)) for n in range(6)]
            await until(lambda: backend_row(proxy)["in_flight"] > 0)  # some in flight
            os.kill(pid, signal.SIGKILL)
            requests += [asyncio.create_task(one(n)) for n in range(6, 12)]  # more arriving
            statuses = await asyncio.wait_for(asyncio.gather(*requests), 60)
        assert statuses == [200] * 12
        row = backend_row(proxy)
        assert row["pid"] != pid and row["restarts"] >= 1


async def test_a_restart_makes_requests_wait_not_fail(tmp_path: Path) -> None:
    """A restart (POST /admin/backends/NAME/restart, and the replacement of a hung process)
    goes through STOPPING: requests that arrive then wait in the model's queue for the new
    process, like after a crash, instead of getting 503 at once."""
    model = simulator_model(draft_control="per-request", slots=4, time_scale=5.0)
    supervisor = {"health_interval_s": 0.2}
    config = proxy_config([model], routing=NO_EXPLORE, supervisor=supervisor)
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        pid = backend_row(proxy)["pid"]
        statuses: list[int] = []
        restarted = asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def loop(n: int) -> None:  # a client sending one request after another
                while not restarted.is_set():
                    request = body("chat", f"{SHORT} {n} {len(statuses)}", 8 + 8 * n)
                    async with session.post(
                        proxy.url + "/v1/chat/completions", json=request
                    ) as response:
                        await response.read()
                        statuses.append(response.status)

            clients = [asyncio.create_task(loop(n)) for n in range(4)]
            await until(lambda: len(statuses) >= 4)
            async with session.post(
                f"{proxy.url}/admin/backends/{BACKEND}/restart",
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            ) as response:
                assert response.status == 200
            await until(lambda: backend_row(proxy)["pid"] not in (None, pid))
            await until(lambda: backend_row(proxy)["state"] == "ready")
            served = len(statuses)
            await until(lambda: len(statuses) >= served + 4)  # served by the new process
            restarted.set()
            await asyncio.wait_for(asyncio.gather(*clients), 60)
    assert set(statuses) == {200}, sorted(statuses)


async def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for a condition, checking it every 20 ms (an event seen from outside)."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def test_requests_that_decoded_beside_another_depth_are_not_learned_from(
    fresh_one_process: ProxyProcess,
) -> None:
    """A drafter among plain requests decodes almost for free while they pay its extra pass, so
    both speeds describe the mix, not their depth: only runs at one depth are learned."""
    proxy = fresh_one_process
    prose = " ".join([SHORT] * 400)  # ~6k tokens: 4k-16k/prose, apart from the lone request
    async with aiohttp.ClientSession() as session:
        pair = (
            send(session, proxy, "chat", f"{prose} {n}", pin=pin, max_tokens=160)
            for n, pin in enumerate(("off", "max"))
        )
        await asyncio.gather(*pair)
        await send(session, proxy, "chat", f"{SHORT} alone", pin="max")
    status, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    classes = {(row["request_class"], row["load_level"]) for row in routing["learned"]}
    assert ("<4k/prose", "1") in classes, classes  # the lone request is learned
    assert not any(c.startswith("4k-16k/") for c, _ in classes), classes


def busy_samples(proxy: ProxyProcess) -> dict[str, float]:
    """What the process measured while busy, per depth (in requests), as /admin/routing says."""
    status, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    samples: dict[str, float] = routing["busy"].get(BACKEND, {}).get("samples", {})
    return samples


async def busy_at_max(session: aiohttp.ClientSession, proxy: ProxyProcess, tag: str) -> None:
    """Three requests decoding side by side at max."""
    same = (
        send(session, proxy, "chat", f"{SHORT} {tag} {n}", pin="max", max_tokens=160)
        for n in range(3)
    )
    await asyncio.gather(*same)


async def test_the_busy_epochs_learn_from_time_at_one_depth_only(
    fresh_one_process: ProxyProcess,
) -> None:
    """Requests decoding beside another depth teach the busy epochs nothing; requests decoding
    beside their own depth teach them, each by its time so (the pool's single-depth clock); a
    client's own depth teaches its own depth's measurements, never the profile it was routed to."""
    proxy = fresh_one_process

    async with aiohttp.ClientSession() as session:
        await send(session, proxy, "chat", f"{SHORT} first")  # routed: the process's epochs
        mixed = (
            send(session, proxy, "chat", f"{SHORT} {n}", pin=pin, max_tokens=160)
            for n, pin in enumerate(("off", "max"))
        )
        await asyncio.gather(*mixed)
        assert busy_samples(proxy) == {}
        await busy_at_max(session, proxy, "same")
        samples = busy_samples(proxy)
        assert set(samples) == {"max"} and samples["max"] > 1.5, samples

        async def own_depth(n: int) -> None:  # routed to max, run at the client's depth 1
            request = {**body("chat", f"{SHORT} own {n}", 160), "speculative.n_max": 1}
            async with session.post(
                proxy.url + PATHS["chat"], json=request, headers={"X-MTP-Profile": "max"}
            ) as response:
                assert response.status == 200

        await asyncio.gather(*(own_depth(n) for n in range(3)))
    after = busy_samples(proxy)
    assert after["max"] == samples["max"] and after["one"] > 1.5, after  # depth 1's speed


async def test_a_stream_still_processing_its_prompt_leaves_the_others_at_one_depth(
    fresh_one_process: ProxyProcess,
) -> None:
    """A long prompt at off, streamed, whose prompt is still being processed while three
    requests decode at max: it decodes at no depth until its first token, so they ran at one
    depth and teach the busy epochs (counting it from its start, they had all run mixed)."""
    proxy = fresh_one_process
    long_text = " ".join([SHORT] * 4500)  # ~45k tokens: ~45 simulated s of prompt processing

    async with aiohttp.ClientSession() as session:
        await send(session, proxy, "chat", f"{SHORT} first")

        async def stream_at_off(text: str, max_tokens: int, first: asyncio.Event) -> None:
            request = {**body("chat", text, max_tokens), "stream": True, "ignore_eos": True}
            headers = {"X-MTP-Profile": "off"}
            async with session.post(proxy.url + PATHS["chat"], json=request, headers=headers) as r:
                assert r.status == 200
                await r.content.readline()
                first.set()  # its first token is out: it decodes from now on
                await r.read()

        tokens = asyncio.Event()
        prompt = asyncio.create_task(stream_at_off(long_text, 8, tokens))
        await until(lambda: backend_row(proxy)["in_flight"] == 1)  # at the backend
        await busy_at_max(session, proxy, "beside a prompt")
        assert not tokens.is_set()  # the premise: the three ran while it had no token yet
        await prompt
        samples = busy_samples(proxy)
        assert samples.get("max", 0.0) > 1.5, samples

        # Once its tokens flow, a stream at off decodes beside them: that teaches nothing.
        flowing = asyncio.Event()
        decoding = asyncio.create_task(stream_at_off(f"{SHORT} long answer", 2000, flowing))
        await asyncio.wait_for(flowing.wait(), 30)
        await busy_at_max(session, proxy, "beside a stream")
        assert not decoding.done()
        await decoding
    assert busy_samples(proxy) == samples


async def test_what_the_busy_epochs_measured_survives_a_restart(tmp_path: Path) -> None:
    state_file = tmp_path / "learned.json"
    for first in one_process_proxy(tmp_path / "first", state_file):
        async with aiohttp.ClientSession() as session:
            await send(session, first, "chat", f"{SHORT} first")  # routed: the process's epochs
            await busy_at_max(session, first, "before")
        measured = busy_samples(first)
        assert set(measured) == {"max"}, measured
    for second in one_process_proxy(tmp_path / "second", state_file):
        assert busy_samples(second) == measured  # before any request: loaded from the file

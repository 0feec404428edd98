"""The start-up calibration against real simulators: it finds each preset's truth, is shown and
kept, costs what it says, measures nothing again after a restart, and no client request runs
beside it. (The real llama-server: tests/llama/test_llama_calibration.py.)"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.processes import spawn_proxy, start_simulator, wait_listening
from proxy.cli.status import render_status
from proxy.config.routing import RoutingSettings
from proxy.routing.calibrate import identity, measure
from proxy.routing.calibration import Calibration
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
# What the published runs say with 4 parallel requests (docs/published-figures.md#concurrency):
# llama.cpp PR #27342 (Vulkan) MTP 0.77x of no drafting at np=4: setup-b; a newer build 4 MTP
# slots 1.97x one slot, ahead of 4 without MTP: setup-b-batched.
TRUTH_AT_4 = {"setup-b": "off", "setup-b-batched": "max"}
SETUP_B_BUDGET_S = 30.0  # the promise: under 30 s on a 27B model (setup-b: a 27B on a 3090)
TOKENS = RoutingSettings().calibration_tokens  # what a proxy measures with


async def measured(preset: str, seed: int) -> Calibration:
    """The calibration a proxy would make, straight against a 4-slot simulator of ``preset``."""
    sim = start_simulator(
        [
            *("--preset", preset, "--time-scale", "50", "-np", "4", "--seed", str(seed)),
            *("--spec-type", "draft-mtp", "--spec-draft-n-max", "3"),
        ]
    )
    try:
        async with aiohttp.ClientSession() as session:
            return await measure(
                session,
                sim.url,
                model=MODEL,
                ident=identity(["sim"], None, MODEL),
                deepest=3,
                slots=4,
                tokens=TOKENS,
                timeout_s=60,
            )
    finally:
        sim.stop()


@pytest.mark.parametrize("preset", sorted(TRUTH_AT_4))
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_measurement_finds_each_presets_truth(preset: str, seed: int) -> None:
    """Directly against the simulator, three seeds each (each seed draws other sessions'
    acceptance and other drafts): the cold rule at 4 slots is the published one."""
    found = await measured(preset, seed)
    assert found.cold_role(4) == TRUTH_AT_4[preset], found.findings([1, 2, 4])
    assert found.cold_role(2) == TRUTH_AT_4[preset]
    assert found.cold_role(1) is None  # alone drafting pays on both: the content rules stand
    assert found.backend_s < SETUP_B_BUDGET_S
    assert {(c.load, c.depth) for c in found.cells} == {(n, d) for n in (1, 2, 4) for d in (0, 3)}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_measurement_splits_the_busy_gap_by_content_kind(seed: int) -> None:
    """rtx3090-250w (the published 3090's code/prose split; truth at 4 decoding: depth 3 1.56x
    depth 0 on code, 0.85x on prose): the burst's code requests show the larger gap, each kind
    measured at both depths."""
    found = await measured("rtx3090-250w", seed)
    kinds = sorted((k.kind, k.depth, k.load) for k in found.busy_kinds)
    at_two = [(k, d, 2) for k in ("code", "prose") for d in (0, 3)]
    assert kinds == sorted(at_two + [(k, d, 4) for k in ("code", "prose") for d in (0, 3)] * 2)
    code, prose = found.ratio(4, "code"), found.ratio(4, "prose")
    assert code is not None and prose is not None
    assert code > 1.1 * prose, found.findings([4])


def one_process(preset: str, state_file: Path | None = None, **routing: Any) -> dict[str, Any]:
    model = simulator_model(preset=preset, draft_control="per-request", time_scale=50.0)
    settings: dict[str, Any] = {"seed": 1, **routing}
    if state_file is not None:
        settings["learned_file"] = str(state_file)
    return proxy_config([model], routing=settings)


def events(proxy: ProxyProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == name]


async def burst(proxy: ProxyProcess, n: int) -> list[tuple[str, str]]:
    """n chats at once: the first busy epoch's depth and reason of each."""

    async def one(session: aiohttp.ClientSession, i: int) -> tuple[str, str]:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Tell me about tide pools, part {i}."}],
            "max_tokens": 64,
        }
        async with session.post(proxy.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            return response.headers["X-MTP-Profile"], response.headers["X-MTP-Route-Reason"]

    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(one(session, i) for i in range(n))))


def samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric of a /metrics page, by their sorted labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


@pytest.mark.parametrize("preset", sorted(TRUTH_AT_4))
async def test_the_proxy_calibrates_shows_and_uses_it(preset: str, tmp_path: Path) -> None:
    with running_proxy(one_process(preset), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        status, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert status == 200
        found = routing["calibration"][BACKEND]
        assert found["levels"]["4"]["cold_role"] == TRUTH_AT_4[preset]
        assert found["levels"]["1"]["cold_role"] == "rules"
        assert found["backend_s"] < SETUP_B_BUDGET_S and found["slots"] == 4
        [logged] = events(proxy, "calibrated")
        assert logged["levels"] == found["levels"] and logged["backend"] == BACKEND
        speeds = samples(proxy.url + "/metrics", "mtp_proxy_calibration_speed_tokens_per_second")
        key = (("backend", BACKEND), ("depth", "3"), ("load", "4"), ("model", MODEL))
        assert speeds[key] == pytest.approx(
            next(c["tok_s"] for c in found["cells"] if (c["load"], c["depth"]) == (4, 3)), rel=0.01
        )
        _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        text = render_status(proxy.url, backends["backends"], routing)
        assert "Start-up calibration" in text and f"4: {TRUTH_AT_4[preset]}" in text
        by_kind = found["levels"]["4"]["by_kind"]  # the burst's code and prose, apart
        assert set(by_kind) == {"code", "prose"}
        assert f"code {by_kind['code']:.2f}x, prose {by_kind['prose']:.2f}x" in text
        # The first busy stretch starts where the measurement said for the traffic it serves:
        # chats one at a time (the box's traffic so far: short prompts), then 4 at once. The
        # process's busy context starts as two admissions of long_context_tokens (the router's
        # prior, fading as it serves: routing.router.RecentContext): after 10 chats it still
        # weighs ~4k tokens, after 30 ~0.5k, where setup-b-batched's measured gap (1.13-1.32x
        # at 4 slots) stays clear of the 5 % margin at its low end.
        for _ in range(30):
            await burst(proxy, 1)
        decided = await burst(proxy, 4)
        busy = [profile for profile, reason in decided if reason == "busy"]
        assert busy and set(busy) == {TRUTH_AT_4[preset]}, (decided, found["levels"])


async def test_off_keeps_the_published_prior(tmp_path: Path) -> None:
    with running_proxy(one_process("setup-b-batched", calibrate="off"), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert routing["calibration"] == {} and not events(proxy, "calibrating")
        decided = await burst(proxy, 4)
        assert {p for p, r in decided if r == "busy"} == {"off"}, decided


def served_requests(proxy: ProxyProcess) -> float:
    """Generation requests the backend has counted (its own /metrics)."""
    _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    port = next(b["port"] for b in backends["backends"] if b["name"] == BACKEND)
    [value] = samples(
        f"http://127.0.0.1:{port}/metrics", "llamacpp:tokens_predicted_total"
    ).values()
    return value


def test_a_restart_measures_nothing_again(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with running_proxy(one_process("setup-b", state), tmp_path / "first") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        first = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["calibration"][BACKEND]
        assert served_requests(proxy) > 1000  # 16 requests of 96 tokens, the probe's 16
    assert first["key"] in state.read_text()  # written at once, not at the next save
    with running_proxy(one_process("setup-b", state), tmp_path / "second") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        again = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["calibration"][BACKEND]
        assert again == first
        assert events(proxy, "calibration_cached") and not events(proxy, "calibrating")
        assert served_requests(proxy) < 100  # only the draft-control probe's two short ones
    # Another -np is another process: measured again.
    changed = one_process("setup-b", state)
    changed["models"][0]["args"][changed["models"][0]["args"].index("-np") + 1] = "2"
    with running_proxy(changed, tmp_path / "third") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        assert events(proxy, "calibrating")


def test_a_calibration_saved_by_an_older_proxy_is_measured_again(tmp_path: Path) -> None:
    """An older proxy's calibration measured alone and the slot count only, without content
    kinds; the busy pick then falls back to the slot count's mean gap. Such a saved one is not
    kept for ever (its key, the binary, model and flags, has not changed): measured again."""
    state = tmp_path / "state.json"
    with running_proxy(one_process("setup-b", state), tmp_path / "first") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
    saved = json.loads(state.read_text())
    [old] = saved["calibrations"].values()
    old["cells"] = [row for row in old["cells"] if row[0] in (1, 4)]
    del old["busy_kinds"]
    state.write_text(json.dumps(saved))
    with running_proxy(one_process("setup-b", state), tmp_path / "second") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        [outdated] = events(proxy, "calibration_outdated")
        assert outdated["loads"] == [1, 4] and not outdated["kinds"]
        assert events(proxy, "calibrating") and not events(proxy, "calibration_cached")
        found = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["calibration"][BACKEND]
        assert sorted({cell["load"] for cell in found["cells"]}) == [1, 2, 4]
        assert found["busy_kinds"]


async def test_a_client_request_waits_for_the_calibration_and_runs_alone(tmp_path: Path) -> None:
    """The measurement runs before the backend is announced ready: a request that arrives while
    it runs waits in the model's queue and is forwarded only after it (the proxy never forwards
    to a backend that is not ready), so it neither slows the measurement nor is slowed by it."""
    config = one_process("setup-b")
    config["models"][0]["args"][config["models"][0]["args"].index("--time-scale") + 1] = "4"
    proxy = spawn_proxy(config, tmp_path)
    try:
        proxy.port = wait_listening(proxy)
        deadline = time.monotonic() + 30
        while not events(proxy, "calibrating"):
            assert time.monotonic() < deadline, proxy.tail()
            await asyncio.sleep(0.02)
        # Not ready yet, and /health says why (time scale 4: the measurement takes seconds).
        status, health = proxy.get_json("/health")
        assert status == 503
        assert health["waiting"][MODEL].startswith(
            f"calibrating: {BACKEND} is measured at each depth before it serves"
        ), health
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 32}
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/v1/completions", json=body) as response,
        ):
            assert response.status == 200, await response.text()
            payload = await response.json()
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)  # flushes the log
        order = [
            line.get("event")
            for line in proxy.log_lines()
            if line.get("event") in ("calibrating", "calibrated", "request")
        ]
        assert order == ["calibrating", "calibrated", "request"], order
        # It decoded alone: at the speed the calibration measured for depth 3 alone (its
        # profile on an idle process: a short prompt), not at a busy burst's.
        cells = routing["calibration"][BACKEND]["cells"]
        alone = next(c["tok_s"] for c in cells if (c["load"], c["depth"]) == (1, 3))
        busy = next(c["tok_s"] for c in cells if (c["load"], c["depth"]) == (4, 3))
        speed = payload["timings"]["predicted_per_second"]
        assert abs(speed - alone) < abs(speed - busy), (speed, alone, busy)
    finally:
        proxy.stop()

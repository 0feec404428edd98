"""An acceptance collapse through the real proxy on a simulator (its run-time fault, POST
/sim/acceptance-scale): detected over hundreds of drafted tokens, depth 0 served meanwhile, the
metric raised and the cause logged, the table learned before kept, drafting tried again on a
back-off schedule, and the guard lifted once acceptance is back. The timeline is printed
(pytest -s) and asserted on in order, never on wall-clock durations."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
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
RETRY_S = 1.0  # the first trial's back-off (30 s by default)


def collapsed_gauge(proxy: ProxyProcess) -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mtp_proxy_acceptance_collapsed":
                assert sample.labels == {"model": MODEL, "backend": BACKEND}
                return sample.value
    raise AssertionError("no mtp_proxy_acceptance_collapsed series")


def drafting_rows(proxy: ProxyProcess) -> dict[tuple[str, str, str], Any]:
    _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    return {
        (r["request_class"], r["load_level"], r["profile"]): (r["acceptance"], r["samples"])
        for r in routing["learned"]
        if r["profile"] != "off"
    }


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.rows: list[tuple[float, str]] = []

    def mark(self, what: str) -> None:
        self.rows.append((time.monotonic() - self.start, what))

    def show(self) -> str:
        return "\n".join(f"  t={t:6.2f}s  {what}" for t, what in self.rows)


async def test_a_collapse_is_served_at_depth_0_and_drafting_comes_back(tmp_path: Path) -> None:
    model = simulator_model(
        draft_control="per-request",
        time_scale=50.0,
        extra_args=["--latent-sigma", "0", "--seed", "3"],
    )
    routing = {
        "seed": 1,
        "exploration_rate": 0.0,
        "cold_exploration_rate": 0.0,
        "collapse_retry_s": RETRY_S,
    }
    timeline = Timeline()
    with running_proxy(proxy_config([model], routing=routing), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        backend_url = next(b["url"] for b in backends["backends"] if b["name"] == BACKEND)
        async with aiohttp.ClientSession() as session:
            n = 0

            async def chat() -> tuple[str, str, dict[str, Any]]:
                nonlocal n
                n += 1
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Tell me about rivers ({n})."}],
                    "max_tokens": 200,
                }
                async with session.post(proxy.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    timings = (await r.json())["timings"]
                    return r.headers["X-MTP-Profile"], r.headers["X-MTP-Route-Reason"], timings

            async def fault(scale: str) -> None:
                async with session.post(
                    backend_url + "/sim/acceptance-scale", json={"acceptance_scale": scale}
                ) as r:
                    assert r.status == 200

            for _ in range(6):  # healthy: short prose drafts at the deepest depth
                profile, reason, timings = await chat()
                assert profile == "max" and timings["draft_n_accepted"] > 0
            learned = drafting_rows(proxy)
            timeline.mark(f"healthy: {n} requests at max, learned {learned}")
            assert collapsed_gauge(proxy) == 0.0

            await fault("0.01")  # the bug: acceptance to the preset's minimum (2 %)
            timeline.mark("fault on: acceptance scale 0.01")
            drafted = 0
            for _ in range(40):
                profile, reason, timings = await chat()
                if reason == "collapsed":
                    break
                drafted += timings.get("draft_n", 0)
            assert (profile, reason) == ("off", "collapsed"), (profile, reason)
            assert "draft_n" not in timings  # depth 0: nothing drafted
            timeline.mark(f"collapse detected after {drafted} drafted tokens; served at off")
            assert drafted >= 256
            assert collapsed_gauge(proxy) == 1.0
            [logged] = [e for e in proxy.log_lines() if e.get("event") == "acceptance_collapsed"]
            assert logged["backend"] == BACKEND and "drafted tokens" in logged["cause"]
            timeline.mark(f"logged cause: {logged['cause']}")
            assert drafting_rows(proxy) == learned  # the collapse taught the table nothing

            trials = await until_trial(chat, timeline)  # the back-off: a trial, still broken
            still = [e for e in proxy.log_lines() if e.get("event") == "acceptance_still_collapsed"]
            assert still and collapsed_gauge(proxy) == 1.0
            timeline.mark(
                f"trial failed ({trials} requests); next in {still[-1]['next_trial_in_s']}s"
            )
            assert still[-1]["next_trial_in_s"] == 2 * RETRY_S  # doubled

            await fault("")  # fixed
            timeline.mark("fault off")
            trials = await until_trial(chat, timeline)
            assert collapsed_gauge(proxy) == 0.0
            timeline.mark(f"trial passed ({trials} requests): guard lifted")
            profile, reason, timings = await chat()
            assert profile == "max" and reason != "collapsed" and timings["draft_n_accepted"] > 0
            timeline.mark(f"drafting again: {profile} ({reason})")
            assert drafting_rows(proxy).keys() == learned.keys()
    print("\ncollapse timeline:\n" + timeline.show())


async def until_trial(chat: Any, timeline: Timeline) -> int:
    """Requests go on at depth 0 until the back-off is over, then the trial's run at max and
    decide; returns how many trial requests it took."""
    deadline = time.monotonic() + 30
    trial = 0
    while time.monotonic() < deadline:
        profile, reason, _ = await chat()
        if reason != "collapsed":
            return trial  # the guard lifted at the previous request
        if profile == "max":
            if not trial:
                timeline.mark("back-off over: drafting trial at max")
            trial += 1
        elif trial:
            return trial  # the trial decided: still collapsed
        else:
            await asyncio.sleep(0.05)  # depth 0 meanwhile; the back-off runs on the proxy clock
    raise AssertionError("no trial within 30 s")

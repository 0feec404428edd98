"""SIGHUP reloads the configuration of a running proxy over real llama-server backends.

Unchanged backends keep their process; changed ones are replaced start-first (the old one
serves until the new one is ready); removed ones stop; added ones start; a FAILED one is retried;
a configuration that does not validate is logged and ignored.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import tomli_w

from tests.support.harness import ProxyProcess, running_proxy
from tests.support.llama_pool import (
    MODEL,
    PROFILES,
    admin_backends,
    all_ready,
    chat,
    identity_model,
    llama_config,
    llama_model,
    log_events,
    pid_alive,
    wait_until,
)

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_model(tmp_path_factory.mktemp("models"))


async def reload(proxy: ProxyProcess, config: dict[str, Any], outcome: str = "reloaded") -> Any:
    """Rewrite the proxy's config file, send SIGHUP, wait for the outcome's log line."""
    seen = len(log_events(proxy, outcome))
    (proxy.log_path.parent / "config.toml").write_text(tomli_w.dumps(config))
    proxy.process.send_signal(signal.SIGHUP)

    async def logged() -> dict[str, Any] | None:
        events = log_events(proxy, outcome)
        return events[-1] if len(events) > seen else None

    line, _ = await wait_until(logged, 30)
    return line


async def watch(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    stop: asyncio.Event,
    seen: list[tuple[int, int]] | None = None,
) -> list[tuple[int, int]]:
    """Until stop: /health status and a request's status, every 20 ms (into `seen`)."""
    seen = [] if seen is None else seen
    while not stop.is_set():
        async with session.get(proxy.url + "/health") as response:
            health = response.status
        status, _, _ = await chat(session, proxy, max_tokens=4)
        seen.append((health, status))
        await asyncio.sleep(0.02)
    return seen


async def grown(seen: list[tuple[int, int]], size: int, timeout: float = 60.0) -> None:
    """Until `seen` holds `size` observations (each one a /health and a request answered)."""
    async with asyncio.timeout(timeout):
        while len(seen) < size:
            await asyncio.sleep(0.02)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


async def test_sighup_keeps_unchanged_replaces_changed_adds_and_removes(
    model: Path, tmp_path: Path
) -> None:
    with running_proxy(llama_config(model), tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            before = await admin_backends(session, proxy)
            changed_min = {**PROFILES[1], "draft_n_min": 2}
            wide = {"name": "wide", "spec_type": "draft-mtp", "draft_n_max": 4}
            new = llama_config(
                model,
                profiles=[PROFILES[0], changed_min, wide],
                supervisor={"health_interval_s": 0.3},  # not applied: takes a restart
            )
            stop = asyncio.Event()
            watching = asyncio.create_task(watch(session, proxy, stop))
            line = await reload(proxy, new)
            await all_ready(session, proxy, 30)
            stop.set()
            seen = await watching
            after = await admin_backends(session, proxy)
            argv = cmdline(after[f"{MODEL}/min"]["pid"])
            status, headers, body = await chat(session, proxy, profile="wide")
        partial = log_events(proxy, "reload_partial")
    assert (line["added"], line["removed"], line["changed"]) == (
        [f"{MODEL}/wide"],
        [f"{MODEL}/max"],
        [f"{MODEL}/min"],
    )
    assert list(after) == [f"{MODEL}/off", f"{MODEL}/min", f"{MODEL}/wide"]
    assert after[f"{MODEL}/off"]["pid"] == before[f"{MODEL}/off"]["pid"]  # untouched
    assert after[f"{MODEL}/min"]["pid"] != before[f"{MODEL}/min"]["pid"]  # replaced
    assert argv[argv.index("--spec-draft-n-min") + 1] == "2"
    assert not pid_alive(before[f"{MODEL}/min"]["pid"])
    assert not pid_alive(before[f"{MODEL}/max"]["pid"])  # removed: stopped
    assert status == 200 and headers["X-MTP-Backend"] == f"{MODEL}/wide"
    assert body["timings"]["draft_n"] > 0
    assert seen and set(seen) == {(200, 200)}  # the model served throughout
    assert partial and partial[-1]["not_applied"] == ["supervisor"]


async def test_the_only_backend_is_replaced_without_a_gap(model: Path, tmp_path: Path) -> None:
    config = llama_config(model, profiles=[PROFILES[0]])
    with running_proxy(config, tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            old = (await admin_backends(session, proxy))[f"{MODEL}/off"]
            new = llama_config(model, profiles=[{**PROFILES[0], "args": ["-b", "512"]}])
            stop = asyncio.Event()
            seen: list[tuple[int, int]] = []
            watching = asyncio.create_task(watch(session, proxy, stop, seen))
            await grown(seen, 2)  # watched before the reload...
            line = await reload(proxy, new)
            await grown(seen, len(seen) + 3)  # ...and after it
            stop.set()
            await watching
            row = (await admin_backends(session, proxy))[f"{MODEL}/off"]
            argv = cmdline(row["pid"])
    assert line["changed"] == [f"{MODEL}/off"]
    assert row["pid"] != old["pid"] and row["state"] == "ready"
    assert argv[argv.index("-b") + 1] == "512"
    # /health never 503 and no request failed: the old process served until the new was ready.
    assert len(seen) >= 5 and set(seen) == {(200, 200)}


async def test_a_config_that_does_not_validate_is_ignored(model: Path, tmp_path: Path) -> None:
    with running_proxy(llama_config(model), tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            before = await admin_backends(session, proxy)
            broken = llama_config(model)
            broken["models"][0]["profiles"][1]["draft_n_min"] = 9  # > draft_n_max 2
            invalid = await reload(proxy, broken, "reload_failed")
            missing = llama_config(model)
            missing["models"][0]["binary"] = str(tmp_path / "no-such-llama-server")
            unusable = await reload(proxy, missing, "reload_failed")
            after = await admin_backends(session, proxy)
            status, _, _ = await chat(session, proxy, profile="max")
    assert "n_min (9) must not exceed n_max (2)" in invalid["error"]
    assert "no-such-llama-server" in unusable["error"]
    assert {n: r["pid"] for n, r in after.items()} == {n: r["pid"] for n, r in before.items()}
    assert status == 200


async def test_reload_retries_a_failed_backend_and_adds_a_model(
    model: Path, tmp_path: Path
) -> None:
    bad = {**PROFILES[2], "args": ["--no-such-flag"]}
    supervisor = {"backoff_initial_s": 0.1, "backoff_max_s": 0.2, "crash_loop_count": 2}
    config = llama_config(model, profiles=[PROFILES[0], bad], supervisor=supervisor)
    name = f"{MODEL}/max"
    with running_proxy(config, tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:

            async def failed() -> bool | None:
                return (
                    True
                    if (await admin_backends(session, proxy))[name]["state"] == "failed"
                    else None
                )

            await wait_until(failed, 15)
            fixed = llama_config(
                model,
                models=[
                    llama_model(model, profiles=[PROFILES[0], PROFILES[2]]),
                    llama_model(model, name="second", profiles=[PROFILES[0]]),
                ],
                supervisor=supervisor,
            )
            line = await reload(proxy, fixed)
            await all_ready(session, proxy, 30)
            status, headers, _ = await chat(session, proxy, model="second")
            async with session.get(proxy.url + "/v1/models") as response:
                models = [m["id"] for m in (await response.json())["data"]]
        health = proxy.get_json("/health")
    assert line["changed"] == [name] and line["added"] == ["second/off"]
    assert status == 200 and headers["X-MTP-Backend"] == "second/off"
    assert models == [MODEL, "second"]
    status, body = health
    assert (status, body["status"]) == (200, "ok")
    assert body["ready_backends"] == {MODEL: 2, "second": 1}

"""Admin endpoints on a real llama-server pool: list backends, restart one, the admin key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy
from tests.support.llama_pool import (
    MODEL,
    PROFILES,
    admin_backends,
    all_ready,
    chat,
    identity_model,
    llama_config,
    pid_alive,
    wait_state,
    wait_until,
)

pytestmark = pytest.mark.llama

ROW_FIELDS = {"state", "pid", "port", "restarts", "last_exit_code", "uptime_s", "in_flight"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def proxy(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    with running_proxy(llama_config(model), tmp_path_factory.mktemp("admin")) as running:
        yield running


async def admin_call(
    method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers or {}) as response,
    ):
        return response.status, await response.json()


async def test_backends_shows_state_pid_port_restarts_exit_code_uptime(
    proxy: ProxyProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        await all_ready(session, proxy, 30)
        first = await admin_backends(session, proxy)
        await asyncio.sleep(0.2)
        second = await admin_backends(session, proxy)
        assert list(first) == [f"{MODEL}/off", f"{MODEL}/min", f"{MODEL}/max"]
        for name, row in first.items():
            assert row.keys() >= ROW_FIELDS
            assert (row["model"], row["profile"]) == (MODEL, name.split("/")[1])
            assert row["state"] == "ready"
            assert (row["restarts"], row["last_exit_code"], row["in_flight"]) == (0, None, 0)
            assert pid_alive(row["pid"])
            assert row["url"] == f"http://127.0.0.1:{row['port']}"
            async with session.get(row["url"] + "/health") as health:  # the port is live
                assert health.status == 200
            assert second[name]["uptime_s"] >= row["uptime_s"] + 0.15


async def test_admin_needs_the_key(proxy: ProxyProcess) -> None:
    url = proxy.url + "/admin/backends"
    assert (await admin_call("GET", url))[0] == 401
    assert (await admin_call("GET", url, {"X-Admin-Key": "wrong"}))[0] == 401
    assert (await admin_call("GET", url, {"Authorization": f"Bearer {ADMIN_KEY}"}))[0] == 200
    assert (await admin_call("GET", url, {"X-Admin-Key": ADMIN_KEY}))[0] == 200
    async with aiohttp.ClientSession() as session:
        before = (await admin_backends(session, proxy))[f"{MODEL}/off"]["pid"]
        status, error = await admin_call("POST", f"{url}/{MODEL}/off/restart")
        assert status == 401 and error["error"]["message"]
        assert (await admin_backends(session, proxy))[f"{MODEL}/off"]["pid"] == before


async def test_restart_replaces_the_process_while_the_others_serve(proxy: ProxyProcess) -> None:
    headers = {"X-Admin-Key": ADMIN_KEY}
    name = f"{MODEL}/min"
    async with aiohttp.ClientSession() as session:
        await all_ready(session, proxy, 30)
        old = (await admin_backends(session, proxy))[name]
        restart = asyncio.create_task(
            admin_call("POST", f"{proxy.url}/admin/backends/{name}/restart", headers)
        )
        during = [await chat(session, proxy, profile="min") for _ in range(3)]
        assert await restart == (200, {"restarting": name})
        new, _ = await wait_state(session, proxy, name, lambda r: r["state"] == "ready", 15)
        served = await chat(session, proxy, profile="min")
    assert all(status == 200 for status, _, _ in during)
    assert new["pid"] != old["pid"] and not pid_alive(old["pid"])
    assert new["restarts"] == old["restarts"] + 1
    assert new["last_exit_code"] == 0  # stopped with SIGTERM: llama-server exits cleanly
    assert new["uptime_s"] < old["uptime_s"] + 5
    assert served[0] == 200 and served[1]["X-MTP-Backend"] == name


async def test_restart_of_an_unknown_backend_is_404(proxy: ProxyProcess) -> None:
    headers = {"X-Admin-Key": ADMIN_KEY}
    status, error = await admin_call(
        "POST", f"{proxy.url}/admin/backends/{MODEL}/nope/restart", headers
    )
    assert status == 404
    assert "tiny/nope" in error["error"]["message"]


async def test_failed_backend_stays_failed_until_an_admin_restart(
    model: Path, tmp_path: Path
) -> None:
    bad = {**PROFILES[2], "args": ["--no-such-flag"]}
    config = llama_config(
        model,
        profiles=[PROFILES[0], bad],
        supervisor={"backoff_initial_s": 0.1, "backoff_max_s": 0.2, "crash_loop_count": 2},
    )
    name = f"{MODEL}/max"
    headers = {"X-Admin-Key": ADMIN_KEY}
    with running_proxy(config, tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            failed, _ = await wait_state(session, proxy, name, lambda r: r["state"] == "failed", 15)
            await asyncio.sleep(1.0)
            still = (await admin_backends(session, proxy))[name]
            status, _ = await admin_call(
                "POST", f"{proxy.url}/admin/backends/{name}/restart", headers
            )

            async def failed_again() -> dict[str, Any] | None:
                row = (await admin_backends(session, proxy))[name]
                return row if row["crash_loops"] == 2 and row["state"] == "failed" else None

            again, _ = await wait_until(failed_again, 15)
    assert (still["state"], still["restarts"]) == ("failed", failed["restarts"])  # no retries
    assert status == 200
    assert again["restarts"] > failed["restarts"]  # the admin call spawned it again


async def test_admin_is_disabled_without_a_key(model: Path, tmp_path: Path) -> None:
    config = llama_config(model, profiles=[PROFILES[0]])
    del config["server"]["admin_key"]
    with running_proxy(config, tmp_path) as proxy:
        started = time.monotonic()
        status, error = await admin_call(
            "GET", proxy.url + "/admin/backends", {"X-Admin-Key": ADMIN_KEY}
        )
        assert time.monotonic() - started < 5
    assert status == 404
    assert "disabled" in error["error"]["message"]

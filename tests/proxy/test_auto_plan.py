"""draft_control = "auto" through the real proxy: the probe of the first process decides.

An honouring backend (the simulator, as the patched llama-server) keeps the one process; one
that ignores the field (the simulator with --ignore-request-draft, as stock llama.cpp) falls
back to the pool where it fits, else to one process at the best single setting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.processes import spawn_proxy, wait_listening
from supervisor.memory import GIB
from tests.support.fake_gpu import fake_nvidia_smi, sparse
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

MODEL = "mtp-demo"
CHAT = {"messages": [{"role": "user", "content": "Tell me about lighthouses."}], "max_tokens": 8}


def backends(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200
    return {row["name"]: row for row in payload["backends"]}


def plan_events(proxy: ProxyProcess) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event", "").startswith("plan")]


async def pinned(proxy: ProxyProcess, profile: str) -> aiohttp.ClientResponse:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.url + "/v1/chat/completions", json=CHAT, headers={"X-MTP-Profile": profile}
        ) as response,
    ):
        await response.read()
        return response


async def test_auto_keeps_one_process_on_a_backend_that_honours_the_depth(
    tmp_path: Path,
) -> None:
    config = proxy_config([simulator_model(draft_control="auto")])
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        row = backends(proxy)[f"{MODEL}/one-process"]
        assert row["draft_control"] == "per-request", row
        response = await pinned(proxy, "off")
        assert response.headers["X-MTP-Backend"] == f"{MODEL}/one-process"
        assert response.headers["X-MTP-Profile"] == "off"
        decided = [e for e in plan_events(proxy) if e["event"] == "plan" and "shape" in e]
        assert decided and decided[-1]["shape"] == "one-process"
        assert "honours the depth field" in decided[-1]["why"]
        assert not [e for e in plan_events(proxy) if e["event"] == "plan_fallback"]


async def test_auto_falls_back_to_the_pool_and_says_so(tmp_path: Path) -> None:
    # Each process loads for a while: the switch has a gap with no ready backend in it.
    args = ["--ignore-request-draft", "--load-time", "1.5"]
    model = simulator_model(draft_control="auto", extra_args=args)
    with listening_proxy(proxy_config([model]), tmp_path) as proxy:
        # Requests sent while the one process loads, and while it is replaced by the pool,
        # wait for a ready backend instead of failing.
        async def request() -> int:
            return (await pinned(proxy, "max")).status

        async with aiohttp.ClientSession() as session:

            async def no_backend_ready() -> bool:
                async with session.get(proxy.url + "/health") as got:
                    return got.status == 503

            early = [asyncio.create_task(request()) for _ in range(4)]
            deadline = asyncio.get_running_loop().time() + 30
            # The one process was probed "ignored" and is being replaced: nothing is ready.
            while not [e for e in plan_events(proxy) if e["event"] == "plan_fallback"]:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            while not await no_backend_ready():  # the one process is stopped first
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            in_the_gap = [asyncio.create_task(request()) for _ in range(4)]
            statuses = await asyncio.wait_for(asyncio.gather(*early, *in_the_gap), 60)
        assert statuses == [200] * 8
        wait_all_ready(proxy, {MODEL: 3})
        assert sorted(backends(proxy)) == [f"{MODEL}/max", f"{MODEL}/min", f"{MODEL}/off"]
        fallback = next(e for e in plan_events(proxy) if e["event"] == "plan_fallback")
        assert fallback["draft_control"] == "ignored"
        assert "does not honour speculative.n_max" in fallback["message"]
        decided = [e for e in plan_events(proxy) if e["event"] == "plan" and "shape" in e]
        assert decided[-1]["shape"] == "pool" and "the pool fits" in decided[-1]["why"]
        response = await pinned(proxy, "min")
        assert response.headers["X-MTP-Backend"] == f"{MODEL}/min"


@contextmanager
def listening_proxy(config: dict[str, Any], workdir: Path) -> Iterator[ProxyProcess]:
    """The proxy once it listens, before any backend is ready."""
    proxy = spawn_proxy(config, workdir)
    try:
        proxy.port = wait_listening(proxy)
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def stock_like_llama_server(tmp_path: Path) -> Path:
    """A "llama-server" that ignores the depth field: the simulator behind a wrapper script."""
    script = tmp_path / "llama-server"
    args = "--ignore-request-draft --preset setup-b --time-scale 20"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m simulator {args} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def test_auto_runs_one_process_at_the_fallback_profile_when_the_pool_does_not_fit(
    tmp_path: Path, stock_like_llama_server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 GiB free besides the running copy (~9 GiB): one copy fits, three do not.
    smi = fake_nvidia_smi(tmp_path / "smi", 12 * 1024)
    monkeypatch.setenv("PATH", f"{smi}:{os.environ.get('PATH', '')}")
    model = {
        "name": MODEL,
        "backend": "llama-server",
        "binary": str(stock_like_llama_server),
        "model_path": str(sparse(tmp_path / "m.gguf", 8 * GIB)),
        "args": ["-c", "8192", "-np", "2"],
        "profiles": simulator_model()["profiles"],
    }
    with running_proxy(proxy_config([model]), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        deadline = asyncio.get_running_loop().time() + 30
        while sorted(backends(proxy)) != [f"{MODEL}/min"]:
            assert asyncio.get_running_loop().time() < deadline, backends(proxy)
            await asyncio.sleep(0.1)
        wait_all_ready(proxy, {MODEL: 1})
        decided = [e for e in plan_events(proxy) if e["event"] == "plan" and "shape" in e]
        assert decided[-1]["shape"] == "single", decided
        assert "the pool does not fit" in decided[-1]["why"]
        assert "one process at min" in decided[-1]["why"]
        response = await pinned(proxy, "max")  # only min runs: the pin cannot be honoured
        assert response.status == 200
        assert response.headers["X-MTP-Backend"] == f"{MODEL}/min"


async def test_a_reload_keeps_the_shape_auto_settled_on(tmp_path: Path) -> None:
    model = simulator_model(draft_control="auto", extra_args=["--ignore-request-draft"])
    with running_proxy(proxy_config([model]), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 3})
        pids = {name: row["pid"] for name, row in backends(proxy).items()}
        proxy.process.send_signal(signal.SIGHUP)  # the same file: nothing changed
        deadline = asyncio.get_running_loop().time() + 30
        while not [line for line in proxy.log_lines() if line.get("event") == "reloaded"]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert {name: row["pid"] for name, row in backends(proxy).items()} == pids
        fallbacks = [e for e in plan_events(proxy) if e["event"] == "plan_fallback"]
        assert len(fallbacks) == 1  # not probed (and fallen back) again


def stopping(proxy: ProxyProcess) -> bool:
    """Whether the proxy logged a backend of it going to "stopping"."""
    return any(
        line.get("event") == "state change" and line.get("to") == "stopping"
        for line in proxy.log_lines()
    )


def processes_with(marker: str) -> list[str]:
    """Command lines of live processes that carry `marker` among their arguments."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in args:
            found.append(b" ".join(args).decode(errors="replace"))
    return found


async def test_a_shutdown_while_auto_falls_back_stops_cleanly(tmp_path: Path) -> None:
    marker = f"{os.getpid()}{id(tmp_path)}"[-9:]  # a seed no other process runs with
    args = ["--ignore-request-draft", "--load-time", "1.5", "--seed", marker]
    model = simulator_model(draft_control="auto", extra_args=args)
    proxy = spawn_proxy(proxy_config([model]), tmp_path)
    try:
        wait_listening(proxy)
        deadline = asyncio.get_running_loop().time() + 30
        while not [e for e in plan_events(proxy) if e["event"] == "plan_fallback"]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        while not stopping(proxy):  # the one process is being stopped by the fallback's reload
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
    finally:
        code = proxy.stop()
    assert code == 0, proxy.tail()
    assert processes_with(marker) == []


async def test_per_request_on_a_backend_that_ignores_the_depth_says_so(tmp_path: Path) -> None:
    model = simulator_model(draft_control="per-request", extra_args=["--ignore-request-draft"])
    with running_proxy(proxy_config([model]), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        warnings = [e for e in proxy.log_lines() if e.get("event") == "depth_not_honoured"]
        assert warnings and warnings[0]["draft_control"] == "ignored", warnings
        assert sorted(backends(proxy)) == [f"{MODEL}/one-process"]  # as configured: no fallback

"""One backend's lifecycle on real child processes (tests/support/backend_child.py) over loopback.

Timings are shrunk (health every 0.1 s, unhealthy after 0.5 s); the measured figures are
printed (`pytest -s`) as well as asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import time

import aiohttp
import pytest

from supervisor import BackendSpec, BackendState
from tests.support.supervised import Recorder, alive, gone, running, spec

S = BackendState


async def test_start_returns_once_spawned_then_ready_after_503_loading() -> None:
    rec = Recorder()
    async with running([spec("a", "--load-time", "1.0")], rec) as sup:
        backend = sup.backend("a")
        assert backend.state is S.STARTING
        assert backend.pid is not None and backend.port is not None
        assert backend.base_url == f"http://127.0.0.1:{backend.port}"
        # What the supervisor sees while the model loads: the real 503 of the child.
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(f"{backend.base_url}/health") as response:
                        status, body = response.status, await response.json()
                        break
                await asyncio.sleep(0.02)
        assert status == 503 and body["error"]["message"] == "Loading model"
        assert backend.state is S.STARTING
        assert await sup.wait_ready(5)
        starting, ready = rec.changes
        assert (starting.state, ready.state) == (S.STARTING, S.READY)
        assert ready.t - starting.t >= 1.0
        assert any(line.startswith("listening on 127.0.0.1:") for line in backend.last_log_lines)
        snapshot = backend.snapshot()
        json.dumps(snapshot)
        assert snapshot["state"] == "ready" and snapshot["pid"] == backend.pid
        assert snapshot["restarts"] == 0 and snapshot["model"] == "m"
        assert isinstance(snapshot["uptime_s"], float) and snapshot["uptime_s"] > 0


async def test_exit_before_ready_then_crash_loop_fails_with_backoff() -> None:
    rec = Recorder()
    async with running([spec("a", "--exit-at-once", "--exit-code", "3")], rec) as sup:
        assert not await sup.wait_ready(10)  # False as soon as it is FAILED
        backend = sup.backend("a")
        assert backend.state is S.FAILED
        assert "crash loop: 4 exits within 30s" in backend.state_reason
        assert backend.restarts == 3 and backend.last_exit_code == 3 and backend.pid is None
        assert backend.crash_loops == 1
        assert backend.last_error is not None
        assert backend.last_error.startswith("exited with code 3 before ready; last output:")
        assert "error: cannot load model: simulated failure" in backend.last_error
        # Backoff doubles, and the waits really happen.
        changes = rec.changes
        delays = [
            float(m.group(1))
            for c in changes
            if c.state is S.STOPPED and (m := re.search(r"restarting in ([\d.]+)s", c.reason))
        ]
        assert delays == [0.05, 0.1, 0.2]
        gaps = [
            later.t - earlier.t
            for earlier, later in itertools.pairwise(changes)
            if earlier.state is S.STOPPED
        ]
        assert all(gap >= delay * 0.9 for gap, delay in zip(gaps, delays, strict=True))

        # restart(name) leaves FAILED and grants a fresh crash-loop budget.
        count = len(rec.changes)
        await sup.restart("a")
        assert rec.changes[count].state is S.STARTING
        await rec.wait("a", S.FAILED, start=count + 1)
        assert backend.restarts == 7 and backend.crash_loops == 2


async def test_kill_9_is_restarted_and_ready_again() -> None:
    rec = Recorder()
    async with running([spec("a")], rec) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        old_pid = backend.pid
        assert old_pid is not None
        count, began = len(rec.changes), time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        stopped = await rec.wait("a", S.STOPPED, start=count)
        ready = await rec.wait("a", S.READY, start=count)
        print(
            f"\nkill -9: exit seen after {stopped.t - began:.3f}s, "
            f"READY again after {ready.t - began:.3f}s"
        )
        assert ready.t - began < 3.0
        assert "killed by SIGKILL; restarting in 0.05s" in stopped.reason
        assert backend.restarts == 1 and backend.last_exit_code == -signal.SIGKILL
        assert backend.pid not in (None, old_pid)
        assert gone(old_pid)


async def test_hung_child_is_unhealthy_then_killed_and_replaced() -> None:
    rec = Recorder()
    async with running([spec("a")], rec) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        old_pid = backend.pid
        assert old_pid is not None
        count, began = len(rec.changes), time.monotonic()
        os.kill(old_pid, signal.SIGSTOP)
        unhealthy = await rec.wait("a", S.UNHEALTHY, start=count)
        stopped = await rec.wait("a", S.STOPPED, start=count)
        ready = await rec.wait("a", S.READY, start=count)
        detected, replaced = unhealthy.t - began, ready.t - began
        print(
            f"\nSIGSTOP: UNHEALTHY after {detected:.3f}s, replaced and READY after {replaced:.3f}s"
        )
        # Window: unhealthy_after, plus up to one interval and one health check timeout.
        assert 0.5 <= detected <= 0.5 + 0.1 + 0.25 + 0.5
        assert stopped.t - unhealthy.t >= 0.5  # replace_after_s
        assert "no answer within 0.25s" in unhealthy.reason
        assert stopped.reason.startswith("killed: no healthy /health for")
        assert replaced < 4.0
        assert backend.pid not in (None, old_pid) and backend.restarts == 1
        assert backend.last_exit_code == -signal.SIGKILL
        assert backend.health_failures >= 3 and backend.crash_loops == 0
        assert gone(old_pid)


async def test_unhealthy_child_that_recovers_keeps_running() -> None:
    rec = Recorder()
    async with running([spec("a")], rec, replace_after_s=10.0) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        pid = backend.pid
        assert pid is not None
        count = len(rec.changes)
        os.kill(pid, signal.SIGSTOP)
        await rec.wait("a", S.UNHEALTHY, start=count)
        os.kill(pid, signal.SIGCONT)
        await rec.wait("a", S.READY, start=count)
        assert rec.states("a", count) == [S.UNHEALTHY, S.READY]
        assert backend.pid == pid and backend.restarts == 0


async def test_stop_terminates_the_group_and_leaves_nothing() -> None:
    rec = Recorder()
    async with running([spec("a")], rec) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        pid = backend.pid
        assert pid is not None
        pgid = os.getpgid(pid)
        assert pgid == pid != os.getpgid(0)  # its own process group
        await sup.stop()
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
        assert backend.state is S.STOPPED and backend.pid is None
        assert backend.last_exit_code == 0  # SIGTERM was enough: a clean exit
        assert "backend_child exiting" in backend.last_log_lines
        await sup.stop()  # idempotent
        assert rec.states("a") == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]


async def test_stop_of_a_hung_process_is_still_graceful() -> None:
    async with running([spec("a")], stop_timeout_s=5.0) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        assert backend.pid is not None
        os.kill(backend.pid, signal.SIGSTOP)
        began = time.monotonic()
        await sup.stop()
        # SIGTERM then SIGCONT: it exits on its own, well before the SIGKILL at 5 s.
        assert time.monotonic() - began < 2.0
        assert backend.last_exit_code == 0


async def test_stop_kills_a_group_that_ignores_sigterm() -> None:
    async with running([spec("a", "--ignore-term", "--grandchild")], stop_timeout_s=0.5) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        pid = backend.pid
        assert pid is not None
        grandchild = next(
            int(line.split("=")[1])
            for line in backend.last_log_lines
            if line.startswith("grandchild pid=")
        )
        assert os.getpgid(grandchild) == pid and alive(grandchild)
        began = time.monotonic()
        await sup.stop()
        took = time.monotonic() - began
        assert 0.5 <= took < 10  # SIGKILL after stop_timeout_s, not a wait for ever
        assert "ignoring SIGTERM" in backend.last_log_lines  # SIGTERM came first
        assert backend.last_exit_code == -signal.SIGKILL
        assert gone(pid) and not alive(grandchild)


async def test_stop_drains_in_flight_requests_first() -> None:
    busy = {"a": 1}
    drain_s = 30.0
    async with running(
        [spec("a")], in_flight=lambda name: busy[name], drain_timeout_s=drain_s
    ) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("a")
        pid = backend.pid
        assert pid is not None
        stopping = asyncio.create_task(sup.stop())
        async with asyncio.timeout(10):
            while backend.state is not S.STOPPING:
                await asyncio.sleep(0.01)
        began = time.monotonic()
        await asyncio.sleep(0.4)  # a stretch in which it must not stop: the request is out
        assert not stopping.done() and alive(pid)
        busy["a"] = 0
        await stopping
        took = time.monotonic() - began
        assert took < drain_s  # it stopped once the request was done, not at the drain timeout
        assert gone(pid) and backend.last_exit_code == 0


async def test_drain_gives_up_after_drain_timeout() -> None:
    async with running([spec("a")], in_flight=lambda name: 1, drain_timeout_s=0.4) as sup:
        assert await sup.wait_ready(5)
        pid = sup.backend("a").pid
        assert pid is not None
        began = time.monotonic()
        await sup.stop()
        assert 0.4 <= time.monotonic() - began < 1.5
        assert gone(pid)


async def test_not_ready_in_time_is_killed_and_retried() -> None:
    rec = Recorder()
    async with running(
        [spec("a", "--load-time", "30")], rec, ready_timeout_s=0.5, stop_timeout_s=0.5
    ) as sup:
        first_pid = sup.backend("a").pid
        assert first_pid is not None
        stopped = await rec.wait("a", S.STOPPED)
        assert stopped.reason.startswith("not ready after 0.5s (/health: 503 Loading model)")
        assert gone(first_pid)
        await rec.wait("a", S.STARTING, start=rec.changes.index(stopped))
        assert sup.backend("a").restarts == 1


async def test_binary_that_cannot_start_fails_with_a_clear_error() -> None:
    missing = BackendSpec("a", "m", "off", ("/nonexistent/llama-server", "-m", "x.gguf"), {})
    async with running([missing], crash_loop_count=1) as sup:
        assert not await sup.wait_ready(5)
        backend = sup.backend("a")
        assert backend.state is S.FAILED and backend.pid is None
        assert backend.last_error is not None
        assert backend.last_error.startswith("cannot start /nonexistent/llama-server:")
        assert "No such file" in backend.last_error

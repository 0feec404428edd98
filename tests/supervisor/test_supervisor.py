"""The pool on real processes: ordering, staggering, remote backends, reload, wait_ready."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from supervisor import Backend, BackendSpec, BackendState, Supervisor
from supervisor.process import free_loopback_port
from tests.support.backend_child import backend_argv
from tests.support.supervised import Recorder, alive, gone, running, spec

S = BackendState


@pytest.fixture
async def remote() -> AsyncIterator[tuple[str, int]]:
    """A backend the supervisor does not own: (base url, pid)."""
    port = free_loopback_port()
    proc = await asyncio.create_subprocess_exec(
        *backend_argv("--host", "127.0.0.1", "--port", str(port)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def test_every_transition_reported_in_order_and_spawns_staggered() -> None:
    rec = Recorder()
    async with running([spec("a"), spec("b")], rec, stagger_s=0.3) as sup:
        a, b = sup.backends
        # start() returned once both were spawned, 0.3 s apart.
        assert a.started_at is not None and b.started_at is not None
        assert b.started_at - a.started_at >= 0.3
        assert await sup.wait_ready(5)
    for name in ("a", "b"):
        assert rec.states(name) == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    # Synchronous: the backend already shows the state the callback was told about.
    assert [c.state for c in rec.changes if c.name == "a"][-1] is a.state


async def test_remote_backend_is_health_checked_but_never_controlled(
    remote: tuple[str, int],
) -> None:
    url, pid = remote
    rec = Recorder()
    remote_spec = BackendSpec("r", "m", "off", (), {}, url=url)
    async with running([remote_spec], rec) as sup:
        assert await sup.wait_ready(5)
        backend = sup.backend("r")
        assert backend.base_url == url and backend.pid is None
        assert backend.port == int(url.rsplit(":", 1)[1])
        count = len(rec.changes)
        os.kill(pid, signal.SIGSTOP)
        await rec.wait("r", S.UNHEALTHY, start=count)
        await asyncio.sleep(1.0)  # past replace_after_s: a local child would be killed now
        assert backend.state is S.UNHEALTHY and alive(pid) and backend.restarts == 0
        os.kill(pid, signal.SIGCONT)
        await rec.wait("r", S.READY, start=count)
        count = len(rec.changes)
        await sup.restart("r")  # for a remote backend: check it again from scratch
        await rec.wait("r", S.READY, start=count)
        assert rec.states("r", count) == [S.STOPPING, S.STOPPED, S.STARTING, S.READY]
    assert backend.snapshot()["state"] == "stopped" and alive(pid)


async def test_remote_backend_down_at_start_becomes_unhealthy() -> None:
    url = f"http://127.0.0.1:{free_loopback_port()}"  # nothing listens there
    rec = Recorder()
    async with running([BackendSpec("r", "m", "off", (), {}, url=url)], rec) as sup:
        assert not await sup.wait_ready(0.3, require_all=False)
        unhealthy = await rec.wait("r", S.UNHEALTHY)
        assert "cannot connect" in unhealthy.reason
        assert rec.states("r") == [S.STARTING, S.UNHEALTHY]


async def test_silence_counts_from_the_last_good_check_sent_not_from_its_slow_answer() -> None:
    """A /health that answers slowly must not delay detection by one interval.

    Health checks keep a 1 s cadence from when they are sent; once the backend hangs, each times
    out 1 s after it was sent. The last good one is sent at T and answered at T + 0.4; the hung
    ones are sent at T + 1 and T + 2 and time out at T + 2 and T + 3. Counted from the send,
    the silence reaches unhealthy_after_s (3 s) at the second hung check; counted from the
    answer, it would be 2.6 s then, and the backend would turn unhealthy only at a third one,
    an interval later. Counted here: the hung checks the backend saw before it was declared
    unhealthy (events, not a wall-clock window that a loaded machine shifts).
    """
    hung: list[float] = []
    hang, release = asyncio.Event(), asyncio.Event()

    async def health(request: web.Request) -> web.Response:
        if hang.is_set():
            hung.append(time.monotonic())
            await release.wait()
            return web.json_response({"status": "hung"}, status=503)
        await asyncio.sleep(0.4)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_loopback_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    seen_at_unhealthy: list[int] = []

    class Counting(Recorder):
        def __call__(self, backend: Backend) -> None:
            super().__call__(backend)
            if backend.state is S.UNHEALTHY:  # synchronous: no further check was sent yet
                seen_at_unhealthy.append(len(hung))

    rec = Counting()
    remote_spec = BackendSpec("r", "m", "off", (), {}, url=f"http://127.0.0.1:{port}")
    try:
        async with running(
            [remote_spec], rec, health_interval_s=1.0, health_timeout_s=1.0, unhealthy_after_s=3.0
        ) as sup:
            assert await sup.wait_ready(5)
            hang.set()
            unhealthy = await rec.wait("r", S.UNHEALTHY, timeout=10)
    finally:
        release.set()
        await runner.cleanup()
    assert seen_at_unhealthy[0] == 2, (seen_at_unhealthy, unhealthy.reason)


class ServingRecorder(Recorder):
    """Also records, at every change, the state of what `backend("b")` would hand out."""

    def __init__(self) -> None:
        super().__init__()
        self.supervisor: Supervisor | None = None
        self.serving_b: list[BackendState] = []

    def __call__(self, backend: Backend) -> None:
        super().__call__(backend)
        if self.supervisor is not None:
            self.serving_b.append(self.supervisor.backend("b").state)


async def test_reload_keeps_unchanged_replaces_changed_without_a_gap() -> None:
    rec = ServingRecorder()
    before = [spec("a"), spec("b"), spec("c")]
    # Health timings far from a loaded machine's pauses: this is about the reload's order (a
    # 0.25 s check timeout once turned a backend unhealthy mid-reload at load 4).
    patient = {"health_timeout_s": 5.0, "unhealthy_after_s": 30.0, "replace_after_s": 30.0}
    async with running(before, rec, **patient) as sup:
        assert await sup.wait_ready(5)
        a, old_b, c = sup.backends
        pids = {x.name: x.pid for x in sup.backends}
        count = len(rec.changes)
        rec.supervisor = sup

        await sup.reload([spec("a"), spec("b", "--load-time", "0.5"), spec("d")])

        assert [x.name for x in sup.backends] == ["a", "b", "d"]
        new_b = sup.backend("b")
        assert sup.backends[0] is a and a.pid == pids["a"]  # untouched
        assert rec.states("a", count) == []
        assert c.state is S.STOPPED and gone(pids["c"] or 0)
        assert new_b is not old_b and old_b.state is S.STOPPED
        assert new_b.spec.argv[-2:] == ("--load-time", "0.5")
        assert new_b.pid not in (None, pids["b"]) and gone(pids["b"] or 0)
        # The old "b" kept serving until the new one was READY...
        changes = rec.changes[count:]
        new_ready = next(c for c in changes if c.ident == id(new_b) and c.state is S.READY)
        old_stopping = next(c for c in changes if c.ident == id(old_b) and c.state is S.STOPPING)
        assert new_ready.t <= old_stopping.t
        # ...and whoever asked for "b" at any change during the reload got a READY backend.
        assert rec.serving_b and all(state is S.READY for state in rec.serving_b)
        assert await sup.wait_ready(5)

        count = len(rec.changes)
        await sup.reload([x.spec for x in sup.backends])  # same specs: nothing happens
        assert rec.changes[count:] == []


async def test_reload_retries_a_failed_backend() -> None:
    rec = Recorder()
    async with running([spec("a", "--exit-at-once")], rec, crash_loop_count=1) as sup:
        assert not await sup.wait_ready(5)
        count = len(rec.changes)
        await sup.reload([spec("a", "--exit-at-once")])  # unchanged, but FAILED
        await rec.wait("a", S.FAILED, start=count)
        assert rec.states("a", count) == [S.STARTING, S.STOPPED, S.STARTING, S.FAILED]
        assert "retried by reload" in rec.changes[count].reason


async def test_wait_ready_all_or_any() -> None:
    specs = [spec("good"), spec("bad", "--exit-at-once")]
    async with running(specs, crash_loop_count=1) as sup:
        assert await sup.wait_ready(5, require_all=False)
        began = time.monotonic()
        assert not await sup.wait_ready(5)  # "bad" is FAILED: no point waiting
        assert time.monotonic() - began < 2.0
        assert sup.backend("bad").state is S.FAILED


def test_supervisor_never_imports_the_proxy() -> None:
    code = (
        "import sys, supervisor.supervisor; "
        "assert not any(m.startswith('proxy') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""Faults on real processes: `mtp-proxy serve` over three real llama-server backends.

kill -9, SIGSTOP (a hung backend), a binary that exits at once (crash loop), and SIGTERM to the
proxy with a stream in flight. Supervisor timings are shrunk (tests/llama_pool.FAST_SUPERVISOR:
health every 0.25 s, unhealthy after 1 s, replaced 2 s later, first backoff 0.5 s as by
default); the defaults' windows are checked in test_supervisor_states.py. Measured restart and
detection times are printed (`pytest -s`) and recorded as test properties.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from supervisor.process import living_group_members
from tests.support.harness import ProxyProcess, running_proxy, start_proxy
from tests.support.llama_pool import (
    CHAT,
    FAST_SUPERVISOR,
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
    wait_state,
    wait_until,
)

pytestmark = pytest.mark.llama

BACKOFF_S = FAST_SUPERVISOR["backoff_initial_s"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_model(tmp_path_factory.mktemp("models"))


async def timed_chat(
    session: aiohttp.ClientSession, proxy: ProxyProcess, profile: str | None
) -> tuple[int, str, float]:
    """(status, backend that answered, monotonic time the answer was complete)."""
    status, headers, _ = await chat(session, proxy, profile=profile, max_tokens=8)
    return status, headers.get("X-MTP-Backend", ""), time.monotonic()


async def health_statuses(
    session: aiohttp.ClientSession, proxy: ProxyProcess, stop: asyncio.Event
) -> list[tuple[int, dict[str, int]]]:
    """Poll /health every 20 ms until stop is set."""
    seen = []
    while not stop.is_set():
        async with session.get(proxy.url + "/health") as response:
            body = await response.json()
            assert "ready_backends" in body, (response.status, body)
            # "full" (every slot busy: a balancer's cue to send work elsewhere) is a 503 with
            # every backend up; what these tests watch is a backend down.
            up = body["status"] == "full"
            seen.append((200 if up else response.status, body["ready_backends"]))
        await asyncio.sleep(0.02)
    return seen


async def test_kill_9_backend_is_restarted_and_requests_go_elsewhere(
    model: Path, tmp_path: Path, record_property: Any
) -> None:
    with running_proxy(llama_config(model), tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            victim = (await admin_backends(session, proxy))[f"{MODEL}/max"]
            stop_polling = asyncio.Event()
            health = asyncio.create_task(health_statuses(session, proxy, stop_polling))
            os.kill(victim["pid"], signal.SIGKILL)
            killed = time.monotonic()
            # A batch right after the kill: half pinned to the killed profile, half routed freely.
            batch = await asyncio.gather(
                *(timed_chat(session, proxy, "max" if i % 2 else None) for i in range(12))
            )
            row, _ = await wait_state(
                session,
                proxy,
                f"{MODEL}/max",
                lambda r: r["state"] == "ready" and r["pid"] != victim["pid"],
                timeout=15,
            )
            restart_s = time.monotonic() - killed
            stop_polling.set()
            statuses = await health
    print(f"\nkill -9 -> ready again: {restart_s:.2f} s (first backoff {BACKOFF_S} s)")
    record_property("restart_after_kill9_s", round(restart_s, 3))
    assert [status for status, _, _ in batch] == [200] * 12
    # Nothing can be served by the killed backend before its backoff ends.
    early = [backend for _, backend, done in batch if done - killed < BACKOFF_S]
    assert f"{MODEL}/max" not in early
    assert row["restarts"] == 1
    assert row["last_exit_code"] == -signal.SIGKILL
    assert not pid_alive(victim["pid"])
    assert BACKOFF_S <= restart_s < BACKOFF_S + 5
    # The model kept two ready backends throughout: /health never left 200.
    assert statuses and {status for status, _ in statuses} == {200}


async def test_hung_backend_is_unhealthy_then_killed_and_replaced(
    model: Path, tmp_path: Path, record_property: Any
) -> None:
    settings = FAST_SUPERVISOR
    with running_proxy(llama_config(model), tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            victim = (await admin_backends(session, proxy))[f"{MODEL}/max"]
            os.kill(victim["pid"], signal.SIGSTOP)
            stopped = time.monotonic()
            # Sent into the hang before anyone knows: stuck until the kill, then retried.
            stuck = asyncio.create_task(chat(session, proxy, profile="max", max_tokens=8))
            await wait_state(
                session, proxy, f"{MODEL}/max", lambda r: r["state"] == "unhealthy", 10
            )
            detect_s = time.monotonic() - stopped
            moved = [await chat(session, proxy, profile="max", max_tokens=8) for _ in range(4)]
            row, _ = await wait_state(
                session,
                proxy,
                f"{MODEL}/max",
                lambda r: r["state"] == "ready" and r["pid"] != victim["pid"],
                timeout=15,
            )
            replace_s = time.monotonic() - stopped
            stuck_status, stuck_headers, _ = await asyncio.wait_for(stuck, 10)
    print(f"\nSIGSTOP -> unhealthy: {detect_s:.2f} s, -> replaced and ready: {replace_s:.2f} s")
    record_property("hung_detect_s", round(detect_s, 3))
    record_property("hung_replace_s", round(replace_s, 3))
    window = settings["unhealthy_after_s"] + settings["health_interval_s"]
    assert settings["unhealthy_after_s"] <= detect_s < window + settings["health_timeout_s"] + 2
    assert detect_s + settings["replace_after_s"] <= replace_s < detect_s + 8
    for status, headers, _ in moved:
        assert status == 200
        assert headers["X-MTP-Backend"] != f"{MODEL}/max"
    assert stuck_status == 200
    assert stuck_headers["X-MTP-Backend"] != f"{MODEL}/max"
    assert row["restarts"] == 1
    assert row["last_exit_code"] == -signal.SIGKILL
    assert row["health_failures"] >= 1
    assert not pid_alive(victim["pid"])


async def test_crash_loop_fails_with_visible_backoff_while_the_rest_serve(
    model: Path, tmp_path: Path
) -> None:
    bad = {**PROFILES[2], "args": ["--no-such-flag"]}  # llama-server exits 1 at once
    config = llama_config(
        model,
        profiles=[*PROFILES[:2], bad],
        supervisor={"backoff_initial_s": 0.2, "backoff_max_s": 1.0, "crash_loop_count": 3},
    )
    with running_proxy(config, tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            waiting: list[dict[str, Any]] = []

            async def failed() -> dict[str, Any] | None:
                row = (await admin_backends(session, proxy))[f"{MODEL}/max"]
                if row["state"] == "stopped" and row["next_start_in_s"] is not None:
                    waiting.append(row)  # between two attempts: the backoff is on show
                return row if row["state"] == "failed" else None

            row, _ = await wait_until(failed, timeout=20, interval=0.02)
            served = [await chat(session, proxy, profile=p) for p in ("max", None, "off")]
            health = proxy.get_json("/health")
        delays = [
            line["reason"].rsplit("restarting in ", 1)[1]
            for line in log_events(proxy, "state change")
            if line.get("backend") == f"{MODEL}/max" and "restarting in" in line["reason"]
        ]
    assert row["crash_loops"] == 1
    assert row["restarts"] == 3  # 4 exits within the window > crash_loop_count 3
    assert row["last_exit_code"] == 1
    assert "invalid argument: --no-such-flag" in row["last_error"]
    assert delays == ["0.20s", "0.40s", "0.80s"]  # exponential backoff
    assert waiting and all(0 <= r["next_start_in_s"] <= 1.0 for r in waiting)
    assert max(r["restarts"] for r in waiting) >= 1
    for status, headers, _ in served:
        assert status == 200
        assert headers["X-MTP-Backend"] in (f"{MODEL}/off", f"{MODEL}/min")
    status, body = health
    assert (status, body["status"], body["ready_backends"]) == (200, "ok", {MODEL: 2})


def sse_events(raw: bytes) -> list[Any]:
    """The data events of an SSE body: JSON objects, and the final "[DONE]" as a string."""
    return [
        line[6:].decode() if line == b"data: [DONE]" else json.loads(line[6:])
        for line in raw.split(b"\n")
        if line.startswith(b"data: ")
    ]


# The backend is paused (SIGSTOP) far shorter than it takes to be declared hung.
PATIENT = {"unhealthy_after_s": 5.0, "replace_after_s": 5.0}
LONG_STREAM = {"model": MODEL, "messages": CHAT, "max_tokens": 600, "stream": True}


async def read_stream(session: aiohttp.ClientSession, proxy: ProxyProcess) -> bytes:
    """A stream pinned to the off backend, read to its end (or to where it was cut)."""
    raw = b""
    headers = {"X-MTP-Profile": "off"}
    url = proxy.url + "/v1/chat/completions"
    with contextlib.suppress(aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        async with session.post(url, json=LONG_STREAM, headers=headers) as response:
            async for chunk in response.content.iter_any():
                raw += chunk
    return raw


async def stream_in_flight(
    session: aiohttp.ClientSession, proxy: ProxyProcess, backend_pid: int
) -> asyncio.Task[bytes]:
    """Start a stream on a paused backend: it is in flight, and cannot end, until SIGCONT.

    (Tiny models generate 600 tokens in ~0.2 s: without the pause the stream could be over
    before the proxy got its signal, and the test would prove nothing.)
    """
    os.kill(backend_pid, signal.SIGSTOP)
    stream = asyncio.create_task(read_stream(session, proxy))
    await wait_state(session, proxy, f"{MODEL}/off", lambda row: row["in_flight"] == 1, 10)
    return stream


def logged_at(proxy: ProxyProcess, event: str, reason: str | None = None) -> float:
    """Timestamp (s) of the first log line of that event (and reason)."""
    line = next(e for e in log_events(proxy, event) if reason is None or e.get("reason") == reason)
    return datetime.fromisoformat(line["timestamp"]).timestamp()


async def test_sigterm_lets_a_stream_finish_and_leaves_no_process(
    model: Path, tmp_path: Path
) -> None:
    pause_s = 1.0
    proxy = start_proxy(llama_config(model, supervisor=PATIENT), tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            rows = await admin_backends(session, proxy)
            pids = [row["pid"] for row in rows.values()]
            backend = rows[f"{MODEL}/off"]["pid"]
            stream = await stream_in_flight(session, proxy, backend)
            proxy.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.sleep(pause_s)
            os.kill(backend, signal.SIGCONT)
            raw = await asyncio.wait_for(stream, FAST_SUPERVISOR["drain_timeout_s"])
            streamed_s = time.monotonic() - signalled
        code = await asyncio.to_thread(proxy.process.wait, 20)
        exited_s = time.monotonic() - signalled
    finally:
        proxy.stop()
    print(f"\nstream went on {streamed_s:.2f} s after SIGTERM; proxy exited after {exited_s:.2f} s")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    assert not any("error" in event for event in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["timings"]["predicted_n"] == LONG_STREAM["max_tokens"]
    assert pause_s <= streamed_s < FAST_SUPERVISOR["drain_timeout_s"]
    order = [  # the stream's line, not the readiness polls' or the admin calls'
        e["event"]
        for e in proxy.log_lines()
        if e.get("event") == "shutting_down" or (e.get("event") == "request" and e.get("api"))
    ]
    assert order == ["shutting_down", "request"]
    assert code == 0
    assert exited_s < FAST_SUPERVISOR["drain_timeout_s"] + FAST_SUPERVISOR["stop_timeout_s"]
    # No process left: neither the proxy's group nor any llama-server (each in its own session).
    assert living_group_members(proxy.process.pid) == []
    assert [pid for pid in pids if pid_alive(pid)] == []


async def test_sigterm_cuts_a_stream_that_outlasts_the_drain_timeout(
    model: Path, tmp_path: Path
) -> None:
    drain_s = 2.0
    config = llama_config(model, supervisor={**PATIENT, "drain_timeout_s": drain_s})
    proxy = start_proxy(config, tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            rows = await admin_backends(session, proxy)
            pids = [row["pid"] for row in rows.values()]
            stream = await stream_in_flight(session, proxy, rows[f"{MODEL}/off"]["pid"])
            proxy.process.send_signal(signal.SIGTERM)  # the backend stays paused
            signalled = time.monotonic()
            code = await asyncio.to_thread(proxy.process.wait, 20)
            exited_s = time.monotonic() - signalled
            raw = await asyncio.wait_for(stream, 5)
    finally:
        proxy.stop()
    print(
        f"\nproxy with a stalled stream exited {exited_s:.2f} s after SIGTERM (drain {drain_s} s)"
    )
    assert b"data: [DONE]" not in raw  # cut: the stream could not finish in time
    assert code == 0
    # Cut at the drain timeout, not later (aiohttp alone would have waited twice as long);
    # then the backends stop (the paused one, resumed by SIGCONT, takes llama-server ~1 s).
    began = logged_at(proxy, "shutting_down")
    # began is read in the test, the log stamp in the proxy: allow the clocks a little skew.
    assert drain_s - 0.05 <= logged_at(proxy, "drain_timed_out") - began < drain_s + 0.5
    assert logged_at(proxy, "state change", "supervisor stopping") - began < drain_s + 1.0
    assert drain_s <= exited_s < drain_s + FAST_SUPERVISOR["stop_timeout_s"] + 2
    # The paused backend too: SIGTERM (with SIGCONT) to its group, SIGKILL if need be.
    assert [pid for pid in pids if pid_alive(pid)] == []


async def test_health_is_503_only_while_a_model_has_no_ready_backend(
    model: Path, tmp_path: Path
) -> None:
    two = [PROFILES[0], PROFILES[2]]
    solo = llama_model(model, name="solo", profiles=[PROFILES[0]])
    config = llama_config(model, models=[llama_model(model, profiles=two), solo])
    with running_proxy(config, tmp_path) as proxy:
        async with aiohttp.ClientSession() as session:
            await all_ready(session, proxy, 30)
            rows = await admin_backends(session, proxy)
            # One backend of the model down: the other serves, /health stays 200.
            stop = asyncio.Event()
            polling = asyncio.create_task(health_statuses(session, proxy, stop))
            os.kill(rows[f"{MODEL}/off"]["pid"], signal.SIGKILL)
            await wait_state(
                session,
                proxy,
                f"{MODEL}/off",
                lambda r: r["state"] == "ready" and r["restarts"] == 1,
                15,
            )
            stop.set()
            one_down = await polling
            # Both down: 503 naming the model with no ready backend, until one is back.
            stop = asyncio.Event()
            polling = asyncio.create_task(health_statuses(session, proxy, stop))
            for name in (f"{MODEL}/off", f"{MODEL}/max"):
                os.kill((await admin_backends(session, proxy))[name]["pid"], signal.SIGKILL)
            await wait_until(lambda: _health_is(session, proxy, 503), 5, interval=0.01)
            solo_status, _, _ = await chat(session, proxy, model="solo")
            await wait_until(lambda: _health_is(session, proxy, 200), 15)
            stop.set()
            both_down = await polling
    assert one_down and {status for status, _ in one_down} == {200}
    assert solo_status == 200  # the other model is served meanwhile
    unavailable = [ready for status, ready in both_down if status == 503]
    assert unavailable and all(ready == {MODEL: 0, "solo": 1} for ready in unavailable)
    assert all(ready[MODEL] > 0 for status, ready in both_down if status == 200)


async def _health_is(
    session: aiohttp.ClientSession, proxy: ProxyProcess, status: int
) -> bool | None:
    async with session.get(proxy.url + "/health") as response:
        return True if response.status == status else None

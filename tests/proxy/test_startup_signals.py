"""Signals that arrive while the proxy still spawns its backends, before it listens.

Unhandled then, SIGTERM and SIGHUP killed the proxy by their default action: no drain, and the
backends it had already spawned were never stopped (orphans, re-parented to init). The
backends here spawn 1.5 s apart, so a signal sent after the first one lands inside that window.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bench.processes import ProxyProcess, spawn_proxy, wait_listening
from tests.support.harness import proxy_config, wait_all_ready

STAGGER_S = 1.5


def first_spawned_pid(proxy: ProxyProcess, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proxy.log_lines():
            if line.get("event") == "spawned":
                assert not any(x.get("event") == "listening" for x in proxy.log_lines())
                return int(line["pid"])
        time.sleep(0.02)
    raise TimeoutError("no backend was spawned")


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_while_backends_spawn_stops_cleanly_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    proxy = spawn_proxy(proxy_config(supervisor={"stagger_s": STAGGER_S}), tmp_path)
    try:
        backend = first_spawned_pid(proxy)
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.process.wait(30) == 0  # a clean stop, not death by signal (-15)
        assert gone(backend), f"backend {backend} outlived the proxy"
        events = [line.get("event") for line in proxy.log_lines()]
        assert "shutting_down" in events
    finally:
        proxy.stop()


def test_sighup_while_backends_spawn_leaves_the_proxy_serving(tmp_path: Path) -> None:
    proxy = spawn_proxy(proxy_config(supervisor={"stagger_s": STAGGER_S}), tmp_path)
    try:
        first_spawned_pid(proxy)
        proxy.process.send_signal(signal.SIGHUP)
        proxy.port = wait_listening(proxy)
        wait_all_ready(proxy, {"mtp-demo": 3})
        assert proxy.process.poll() is None
    finally:
        assert proxy.stop() == 0

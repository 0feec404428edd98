"""systemd readiness (Type=notify) on a real `mtp-proxy serve`: the datagrams it sends.

The test owns the unix datagram socket that $NOTIFY_SOCKET names, as systemd does for a
`Type=notify` unit, and runs the proxy with that variable set. systemd starts routing
traffic (and returns from `systemctl start`) at READY=1, so READY=1 must mean "serving";
`systemctl reload` waits for RELOADING=1 ... READY=1; STOPPING=1 tells it the stop began.
"""

from __future__ import annotations

import signal
import socket
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.processes import spawn_proxy, wait_listening
from tests.support.harness import ProxyProcess, free_port, proxy_config, simulator_model

# Backends spawned 1.5 s apart: the first is ready before the last is even spawned, which is
# when a READY=1 sent too early (before the listener is up) would show.
STAGGER_S = 1.5


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    # A short directory: a unix socket path is limited to 107 bytes, pytest's tmp_path can be
    # longer than that.
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        path = str(Path(directory) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            yield sock, path


def receive(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    try:
        return sock.recv(4096).decode()
    except TimeoutError:
        raise AssertionError(f"no sd_notify datagram within {timeout}s") from None


def health_status(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return int(response.status)


def wait_logged(proxy: ProxyProcess, event: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(line.get("event") == event for line in proxy.log_lines()):
        assert time.monotonic() < deadline, f"no {event!r} log line within {timeout}s"
        time.sleep(0.02)


def test_ready_at_start_reloading_then_ready_on_sighup_stopping_on_sigterm(
    tmp_path: Path, notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    port = free_port()  # fixed up front: the test must reach the proxy the instant READY=1 comes
    config = proxy_config(
        [simulator_model()], server={"port": port}, supervisor={"stagger_s": STAGGER_S}
    )
    proxy = spawn_proxy(config, tmp_path)
    try:
        assert receive(sock, 30) == "READY=1"
        # Ready means serving: the listener is up and a model has a ready backend.
        assert health_status(port) == 200
        assert wait_listening(proxy) == port

        sent_before = time.monotonic_ns() // 1000
        proxy.process.send_signal(signal.SIGHUP)  # the config file is unchanged: a no-op reload
        reloading = receive(sock, 30)
        lines = dict(line.split("=", 1) for line in reloading.split("\n"))
        assert lines.keys() == {"RELOADING", "MONOTONIC_USEC"}, reloading
        assert lines["RELOADING"] == "1"
        # systemd matches the reload by this timestamp: CLOCK_MONOTONIC, microseconds.
        stamp = int(lines["MONOTONIC_USEC"])
        assert sent_before <= stamp <= time.monotonic_ns() // 1000
        assert receive(sock, 30) == "READY=1"
        wait_logged(proxy, "reloaded")  # a reload that was applied, not skipped or refused

        proxy.process.send_signal(signal.SIGTERM)
        assert receive(sock, 30) == "STOPPING=1"
        assert proxy.process.wait(30) == 0
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # nothing after STOPPING=1 (no stray READY=1 from a late backend)
    finally:
        proxy.stop()

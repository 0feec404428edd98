"""systemd readiness (Type=notify) on a real `mtp-proxy serve`: the datagrams it sends.

The test owns the unix datagram socket that $NOTIFY_SOCKET names, as systemd does for a
`Type=notify` unit, and runs the proxy with that variable set. systemd starts routing
traffic (and returns from `systemctl start`) at READY=1, so READY=1 must mean "serving";
`systemctl reload` waits for RELOADING=1 ... READY=1; STOPPING=1 tells it the stop began.
"""

from __future__ import annotations

import json
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.processes import spawn_proxy, wait_listening
from tests.support.harness import ProxyProcess, free_port, proxy_config, simulator_model
from tests.support.misbehaving_backend import running_backend

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


def test_ready_waits_for_every_model_the_slow_one_too(
    tmp_path: Path, notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two models, one of them slow to load: while only the quick one has a ready backend,
    nothing is sent; READY=1 comes once both do (systemd would otherwise route traffic that the
    slow model cannot serve yet)."""
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    port = free_port()
    quick = simulator_model("quick", profiles=[{"name": "off"}])
    slow = simulator_model("slow", profiles=[{"name": "off"}], extra_args=["--load-time", "3"])
    proxy = spawn_proxy(proxy_config([quick, slow], server={"port": port}), tmp_path)
    try:
        wait_listening(proxy)
        deadline = time.monotonic() + 30
        while health(port)["ready_backends"] != {"quick": 1, "slow": 0}:
            assert time.monotonic() < deadline, health(port)
            time.sleep(0.02)
        sock.settimeout(0)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)  # the quick model is ready, the slow one not: no READY=1 yet
        assert receive(sock, 30) == "READY=1"
        answer = health(port)
        assert (answer["status"], answer["ready_backends"]) == ("ok", {"quick": 1, "slow": 1})
    finally:
        proxy.stop()


def health(port: int) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            answer: dict[str, object] = json.loads(response.read())
    except urllib.error.HTTPError as error:  # 503 while a model has no ready backend
        answer = json.loads(error.read())
    return answer


def test_sigterm_stops_listening_and_lets_a_stream_finish(
    tmp_path: Path, notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At SIGTERM the proxy says STOPPING=1 and stops listening (a new connection is refused)
    while a stream in flight goes on to its end: both come before the stream's last event
    (STOPPING=1 came only after the drain, so systemd learnt of the stop at its end)."""
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    port = free_port()
    with running_backend("ok", "--chunks", "40", "--interval", "0.1") as echo_url:  # 4 s
        model = {
            "name": "echo",
            "backend": "simulator",
            "profiles": [{"name": "e", "url": echo_url}],
        }
        proxy = spawn_proxy(proxy_config([model], server={"port": port}), tmp_path)
        try:
            assert receive(sock, 30) == "READY=1"
            body = {"model": "echo", "messages": [], "stream": True}
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as stream:
                assert stream.readline().startswith(b"data: ")  # under way
                ended: list[float] = []
                reader = threading.Thread(target=lambda: ended.append(read_to_end(stream)))
                reader.start()
                proxy.process.send_signal(signal.SIGTERM)
                assert receive(sock, 30) == "STOPPING=1"
                stopping_at = time.monotonic()
                deadline = time.monotonic() + 30
                while listening(port):
                    assert time.monotonic() < deadline, "still accepting connections"
                    time.sleep(0.02)
                refused_at = time.monotonic()
                reader.join(60)
            # STOPPING=1 and the refusal both came while the stream went on
            assert ended and stopping_at <= refused_at < ended[0], (refused_at, ended)
            assert proxy.process.wait(30) == 0
        finally:
            proxy.stop()


def read_to_end(stream: Any) -> float:
    """Read a stream to its [DONE] event; when that came."""
    rest = stream.read()
    assert rest.rstrip().endswith(b"data: [DONE]"), rest[-200:]
    return time.monotonic()


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return False
    return True

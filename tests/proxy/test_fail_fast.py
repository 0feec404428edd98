"""Fail fast on a real `mtp-proxy serve`: a model whose every backend fails before one was ever
ready ends the start-up (exit status 3, READY=1 never sent, one line with the cause), while a
model that fails after it was ready keeps the supervisor's restarts. The causes, on the real
llama-server: tests/llama/test_fail_fast.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from bench.processes import spawn_proxy
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

FAST_FAIL = {"crash_loop_count": 1, "backoff_initial_s": 0.1, "backoff_max_s": 0.2}


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:  # a short path: 107 bytes max
        path = str(Path(directory) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(0)
            yield sock, path


def datagrams(sock: socket.socket) -> list[str]:
    received = []
    while True:
        try:
            received.append(sock.recv(65536).decode())
        except BlockingIOError:
            return received


def events(proxy: ProxyProcess) -> list[str]:
    return [str(line.get("event")) for line in proxy.log_lines()]


def test_a_model_that_never_starts_ends_the_start_up_with_its_cause(
    tmp_path: Path, notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    good = simulator_model(profiles=[{"name": "off"}], draft_control="per-request")
    broken = simulator_model(
        "broken", preset="no-such-preset", profiles=[{"name": "off"}], draft_control="per-request"
    )
    proxy = spawn_proxy(proxy_config([good, broken], supervisor=FAST_FAIL), tmp_path)
    try:
        code = proxy.process.wait(60)
    finally:
        proxy.stop()
    output = proxy.log_path.read_text()
    sent = datagrams(sock)
    assert code == 3, output
    assert "Traceback" not in output
    # One line on stderr, the model and the cause in it (the simulator's own words here).
    (line,) = [x for x in output.splitlines() if x.startswith("mtp-proxy: model broken")]
    assert line.startswith(
        "mtp-proxy: model broken cannot start (2 attempts, last: exited with code 2 before ready)"
    )
    assert "unknown preset 'no-such-preset'" in line
    # The good model was ready, yet the service never said so: systemd sees a failed start.
    assert "READY=1" not in sent and "STOPPING=1" in sent
    assert f"STATUS={line.removeprefix('mtp-proxy: ')}" in sent
    # The verdict, then the shutdown at once: nothing spawned in between.
    seen = events(proxy)
    after = seen[seen.index("model_cannot_start") :]
    assert "shutting_down" in after and "spawned" not in after, after


def test_a_model_that_was_ready_keeps_its_restarts_and_the_proxy(tmp_path: Path) -> None:
    model = simulator_model(profiles=[{"name": "off"}], draft_control="per-request")
    with running_proxy(proxy_config([model], supervisor=FAST_FAIL), tmp_path) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        for _ in range(2):  # two exits within the window: FAILED (crash_loop_count 1)
            pid = backend_row(proxy)["pid"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while backend_row(proxy)["pid"] in (pid, None) and backend_row(proxy)["state"] != (
                "failed"
            ):
                assert time.monotonic() < deadline, backend_row(proxy)
                time.sleep(0.05)
        deadline = time.monotonic() + 20
        while backend_row(proxy)["state"] != "failed":
            assert time.monotonic() < deadline, backend_row(proxy)
            time.sleep(0.05)
        assert proxy.get_json("/health")[0] == 503
        # Still serving its admin endpoints: a restart brings the model back, as before.
        restart = urllib.request.Request(
            f"{proxy.url}/admin/backends/mtp-demo/one-process/restart",
            method="POST",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        )
        with urllib.request.urlopen(restart, timeout=30) as response:
            assert response.status == 200
        wait_all_ready(proxy, {"mtp-demo": 1})
        assert proxy.process.poll() is None
        assert "model_cannot_start" not in events(proxy)


def backend_row(proxy: ProxyProcess) -> dict[str, object]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    (row,) = rows
    return dict(row)


def test_a_reload_adding_a_model_that_never_starts_keeps_the_proxy(tmp_path: Path) -> None:
    """After start-up, giving up on a model is the supervisor's business, as before: the proxy
    that serves the others stays."""
    good = simulator_model(profiles=[{"name": "off"}], draft_control="per-request")
    config = proxy_config([good], supervisor=FAST_FAIL)
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        broken = simulator_model(
            "broken", preset="no-such-preset", profiles=[{"name": "off"}],
            draft_control="per-request",
        )  # fmt: skip
        (tmp_path / "config.toml").write_text(tomli_w.dumps({**config, "models": [good, broken]}))
        proxy.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while not any(
            line.get("backend") == "broken/one-process" and line.get("to") == "failed"
            for line in proxy.log_lines()
        ):
            assert time.monotonic() < deadline, proxy.tail()
            time.sleep(0.05)
        assert proxy.process.poll() is None, proxy.tail()
        assert proxy.get_json("/health")[0] == 503  # broken has no ready backend
        assert "model_cannot_start" not in events(proxy)


def test_a_failed_backends_cause_shows_in_admin_and_status(tmp_path: Path) -> None:
    """A backend given up on while the proxy serves (here a model a reload added) shows its
    cause in plain words in /admin/backends and `mtp-proxy status`."""
    fake = tmp_path / "llama-server"  # says what llama-server says of a flag it does not know
    fake.write_text("#!/bin/sh\necho 'error: invalid argument: --nope' >&2\nexit 1\n")
    fake.chmod(0o755)
    good = simulator_model(profiles=[{"name": "off"}], draft_control="per-request")
    config = proxy_config([good], supervisor=FAST_FAIL)
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        bad = {
            "name": "bad", "binary": str(fake), "model_path": str(tmp_path / "m.gguf"),
            "draft_control": "per-request", "profiles": [{"name": "off"}],
        }  # fmt: skip
        (tmp_path / "config.toml").write_text(tomli_w.dumps({**config, "models": [good, bad]}))
        proxy.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (row := rows(proxy).get("bad/one-process", {})).get("state") != "failed":
            assert time.monotonic() < deadline, proxy.tail()
            time.sleep(0.05)
        status = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "status", "--url", proxy.url,
             "--admin-key", ADMIN_KEY],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert row["cause"] == "llama-server does not know the flag --nope"
    assert status.returncode == 0, status.stderr
    # Its row in the Backends table, the first of its rows (the depth table comes after).
    line = next(x for x in status.stdout.splitlines() if x.startswith("bad/one-process"))
    assert "llama-server does not know the flag --nope" in line


def rows(proxy: ProxyProcess) -> dict[str, dict[str, object]]:
    backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return {str(row["name"]): dict(row) for row in backends}

"""Start, reload and death of a real proxy process: a reload whose backends cannot start keeps
the old ones serving; a port in use, a missing binary, corrupt learned files; children that die
with a proxy killed by SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from bench.processes import ProxyProcess, spawn_proxy, start_proxy, wait_listening
from tests.support.harness import ADMIN_KEY, proxy_config, simulator_model, wait_all_ready

CHAT = {"model": "mtp-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def chat_status(proxy: ProxyProcess) -> int:
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(CHAT).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def backend_pids(proxy: ProxyProcess) -> dict[str, int]:
    _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    rows = backends["backends"] if isinstance(backends, dict) else backends
    return {row["name"]: row["pid"] for row in rows if row.get("pid")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead, only not yet reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def events(proxy: ProxyProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == name]


# --- a reload whose changed backends cannot start -------------------------------------------------


def test_a_reload_whose_backends_cannot_start_keeps_the_old_ones(tmp_path: Path) -> None:
    supervisor = {"crash_loop_count": 1, "backoff_initial_s": 0.1, "ready_timeout_s": 20}
    config = proxy_config(supervisor=supervisor)
    proxy = start_proxy(config, tmp_path)
    try:
        wait_all_ready(proxy, {"mtp-demo": 3})
        before = backend_pids(proxy)
        broken = json.loads(json.dumps(config))
        # Validates, cannot start; and would have fewer slots than the processes that stay.
        broken["models"] = [simulator_model(preset="no-such-preset", slots=2)]
        (tmp_path / "config.toml").write_text(tomli_w.dumps(broken))
        proxy.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        statuses = set()
        while time.monotonic() < deadline and len(events(proxy, "reloaded")) < 1:
            statuses.add(chat_status(proxy))
            assert proxy.get_json("/health")[0] == 200
            time.sleep(0.1)
        assert events(proxy, "reloaded"), proxy.tail()
        assert statuses == {200}
        kept = events(proxy, "replacement failed, old backend kept")
        assert sorted(line["backend"] for line in kept) == sorted(before)
        assert all(line["state"] == "failed" for line in kept)
        assert backend_pids(proxy) == before  # the very same processes serve on
        _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        assert {row["slots"] for row in backends["backends"]} == {4}  # theirs, not the file's
        assert proxy.get_json("/health")[1]["ready_backends"] == {"mtp-demo": 3}
    finally:
        proxy.stop()


# --- the port is bound before children are spawned ------------------------------------------------


def test_a_port_in_use_exits_2_at_once_without_spawning(tmp_path: Path) -> None:
    with socket.socket() as occupant:
        occupant.bind(("127.0.0.1", 0))
        occupant.listen()
        port = occupant.getsockname()[1]
        config = proxy_config(server={"port": port})
        proxy = spawn_proxy(config, tmp_path)
        try:
            code = proxy.process.wait(15)
        finally:
            proxy.stop()
    output = proxy.log_path.read_text()
    assert code == 2, output
    assert f"cannot listen on 127.0.0.1:{port}" in output and "in use" in output
    assert "Traceback" not in output
    assert not events(proxy, "spawned")


# --- a missing or non-executable backend binary ---------------------------------------------------


@pytest.mark.parametrize("binary", ["/nonexistent/llama-server", "not-executable"])
def test_an_unusable_binary_exits_2_listing_the_problems(tmp_path: Path, binary: str) -> None:
    if binary == "not-executable":
        binary = str(tmp_path / "llama-server")
        Path(binary).write_text("#!/bin/sh\n")  # a file, but mode 0644
    model = {
        "name": "m",
        "backend": "llama-server",
        "binary": binary,
        "model_path": str(tmp_path / "m.gguf"),
        "profiles": [{"name": "off"}, {"name": "on", "spec_type": "draft-mtp"}],
    }
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps({"server": {"port": 0}, "models": [model]}))
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        done = subprocess.run(
            [sys.executable, "-m", "proxy.cli", *command],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr + done.stdout
        assert "models.0.profiles.0 (m/off)" in done.stderr
        assert "models.0.profiles.1 (m/on)" in done.stderr
        assert "is not an executable file" in done.stderr


# --- corrupt learned files ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "deep", "garbage", "directory"])
def test_a_corrupt_state_file_starts_empty_with_a_warning(tmp_path: Path, kind: str) -> None:
    state = tmp_path / "state" / "routing.json"
    state.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(state)
    elif kind == "deep":
        state.write_text("[" * 200_000)
    elif kind == "garbage":
        state.write_bytes(b"\x00\xff\xfe not json")
    else:
        state.mkdir()
    config = proxy_config(routing={"learned_file": str(state)})
    proxy = spawn_proxy(config, tmp_path / "proxy")
    try:
        proxy.port = wait_listening(proxy, timeout=20)
        proxy.wait_healthy(20)
        assert chat_status(proxy) == 200
        warnings = events(proxy, "stats_state_unreadable") + events(proxy, "stats_state_corrupt")
        assert warnings and warnings[0]["level"] == "warning"
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert "starting empty" in routing["state"]
    finally:
        proxy.stop()


# --- children die with the proxy ------------------------------------------------------------------


def test_children_die_with_a_proxy_killed_by_sigkill_and_a_restart_serves(tmp_path: Path) -> None:
    config = proxy_config()
    proxy = start_proxy(config, tmp_path / "first")
    pids: dict[str, int] = {}
    try:
        wait_all_ready(proxy, {"mtp-demo": 3})
        pids = backend_pids(proxy)
        assert len(pids) == 3
        proxy.process.send_signal(signal.SIGKILL)
        proxy.process.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(pid) for pid in pids.values()):
            time.sleep(0.05)
        assert not [name for name, pid in pids.items() if alive(pid)]
        config["server"]["port"] = proxy.port  # the same port again: nothing left holds it
        again = start_proxy(config, tmp_path / "second")
        try:
            assert again.port == proxy.port
            assert chat_status(again) == 200
        finally:
            again.stop()
    finally:
        for pid in pids.values():  # never leave a test's processes behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proxy.stop()


def test_a_reload_whose_successor_is_not_ready_in_time_keeps_the_old_one(tmp_path: Path) -> None:
    """A changed backend's successor that is still loading at ready_timeout_s is dropped; the
    old process serves on, throughout, with no 503."""
    ready_timeout_s = 2.0
    model = simulator_model(profiles=[{"name": "off"}])
    config = proxy_config([model], supervisor={"ready_timeout_s": ready_timeout_s})
    proxy = start_proxy(config, tmp_path)
    try:
        wait_all_ready(proxy, {"mtp-demo": 1})
        before = backend_pids(proxy)
        slow = json.loads(json.dumps(config))
        slow["models"] = [
            simulator_model(profiles=[{"name": "off"}], extra_args=["--load-time", "600"])
        ]
        (tmp_path / "config.toml").write_text(tomli_w.dumps(slow))
        proxy.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        statuses = set()
        while time.monotonic() < deadline and not events(proxy, "reloaded"):
            statuses.add(chat_status(proxy))
            assert proxy.get_json("/health")[0] == 200
            time.sleep(0.1)
        assert events(proxy, "reloaded"), proxy.tail()
        (kept,) = events(proxy, "replacement failed, old backend kept")
        assert (kept["backend"], kept["state"]) == ("mtp-demo/off", "starting")
        assert kept["after_s"] >= ready_timeout_s
        assert statuses == {200}
        assert backend_pids(proxy) == before  # the very same process serves on
        assert chat_status(proxy) == 200
    finally:
        proxy.stop()

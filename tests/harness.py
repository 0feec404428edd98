"""Real processes for tests: the proxy (`mtp-proxy serve`) on a loopback port with its pool.

The proxy runs as a child process exactly as a user runs it; its JSON log goes to a file the
test can read (and that is printed when a test fails to start it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

ADMIN_KEY = "test-admin-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def simulator_model(
    name: str = "mtp-demo",
    *,
    preset: str = "setup-b",
    time_scale: float = 20.0,
    slots: int = 4,
    extra_args: list[str] | None = None,
    profiles: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A model served by simulated backends off/min/max (time compressed for fast tests)."""
    args = ["--preset", preset, "--time-scale", str(time_scale), "-np", str(slots), "-c", "131072"]
    return {
        "name": name,
        "backend": "simulator",
        "args": args + (extra_args or []),
        "profiles": profiles
        or [
            {"name": "off"},
            {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
            {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
        ],
    }


def proxy_config(
    models: list[dict[str, Any]] | None = None,
    *,
    server: dict[str, Any] | None = None,
    supervisor: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN_KEY, **(server or {})},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 0.5, **(supervisor or {})},
        "routing": routing or {},
        "models": models or [simulator_model()],
    }


@dataclass
class ProxyProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
        return lines

    def get_json(self, path: str, *, admin: bool = False) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path)
        if admin:
            request.add_header("Authorization", f"Bearer {ADMIN_KEY}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited {self.process.returncode}:\n{self.tail()}")
            try:
                if self.get_json("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"proxy not healthy after {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_proxy(config: dict[str, Any], workdir: Path, *, wait: bool = True) -> ProxyProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.toml"
    config_path.write_text(tomli_w.dumps(config))
    log_path = workdir / "proxy.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    proxy = ProxyProcess(process, log_path, port=0)
    proxy.port = _wait_listening(proxy)
    if wait:
        proxy.wait_healthy()
    return proxy


def _wait_listening(proxy: ProxyProcess, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proxy.log_lines():
            if line.get("event") == "listening":
                return int(line["port"])
        if proxy.process.poll() is not None:
            raise RuntimeError(f"proxy exited {proxy.process.returncode}:\n{proxy.tail()}")
        time.sleep(0.05)
    raise TimeoutError(f"proxy did not listen within {timeout}s:\n{proxy.tail()}")


@contextmanager
def running_proxy(config: dict[str, Any], workdir: Path) -> Iterator[ProxyProcess]:
    proxy = start_proxy(config, workdir)
    try:
        yield proxy
    finally:
        proxy.stop()

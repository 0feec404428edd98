"""Real processes for tests and benchmarks: the proxy (`mtp-proxy serve`) and the simulator.

Each runs as a child process exactly as a user runs it, on a loopback port; the proxy's JSON
log goes to a file the caller can read (and that is shown when it fails to start).

They end with the process that started them, whatever ends it: each child is killed by the
kernel when its parent dies (Linux's parent-death signal; the proxy's own children die with the
proxy the same way), so a benchmark stopped by `timeout` (SIGTERM), Ctrl-C or kill -9 leaves
no proxy or simulator behind. `ended_by_signals` also turns SIGTERM and SIGHUP into an
exception, so a benchmark's own clean-up (`finally:`) runs first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import tomli_w

from supervisor.process import parent_death_hook


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived (see ended_by_signals)."""


@contextlib.contextmanager
def ended_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Terminated in the main thread while inside: clean-up code runs
    (the proxies are stopped) before the process ends, with 128 + the signal's number."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise Terminated(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(
    argv: list[str],
    log_path: Path | None,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A benchmark's child: in a session of its own, ended with the benchmark (parent death
    signal), its output into ``log_path`` (None: discarded)."""
    with contextlib.ExitStack() as stack:
        out: Any = subprocess.DEVNULL
        if log_path is not None:
            out = stack.enter_context(log_path.open("wb"))
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT if log_path is not None else subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=parent_death_hook(),  # noqa: PLW1509 (only calls prctl, looked up before)
        )


def wait_ok(
    url: str, process: subprocess.Popen[bytes], what: str, *, timeout: float, every_s: float = 0.05
) -> bool:
    """Poll ``url`` until it answers 200 (True) or ``timeout`` passes (False); RuntimeError
    naming ``what`` if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:  # refused while it starts; URLError and HTTPError are OSErrors
            pass
        time.sleep(every_s)
    return False


def stop_child(process: subprocess.Popen[bytes], timeout: float, *, group: bool = False) -> int:
    """SIGTERM (to its whole process group with ``group``), SIGKILL after ``timeout``."""
    if process.poll() is None:
        send = (lambda sig: os.killpg(process.pid, sig)) if group else process.send_signal
        send(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait()
    return process.returncode


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

    def get_json(self, path: str, *, admin_key: str | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path)
        if admin_key:
            request.add_header("Authorization", f"Bearer {admin_key}")
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
        return stop_child(self.process, timeout)


def start_proxy(
    config: dict[str, Any], workdir: Path, *, wait: bool = True, checkout: Path | None = None
) -> ProxyProcess:
    """Run `mtp-proxy serve` on `config`; from another `checkout` of the repo when given (its
    `proxy` package is found first from there), to compare two versions side by side."""
    proxy = spawn_proxy(config, workdir, checkout=checkout)
    proxy.port = wait_listening(proxy)
    if wait:
        proxy.wait_healthy()
    return proxy


def spawn_proxy(
    config: dict[str, Any], workdir: Path, *, checkout: Path | None = None
) -> ProxyProcess:
    """Start `mtp-proxy serve` and return at once: it may not listen yet (port 0 until then)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.toml"
    config_path.write_text(tomli_w.dumps(config))
    log_path = workdir / "proxy.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config_path)]
    return ProxyProcess(spawn(argv, log_path, env=env, cwd=checkout), log_path, port=0)


def wait_listening(proxy: ProxyProcess, timeout: float = 20.0) -> int:
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


@dataclass
class ServerProcess:
    """A child serving HTTP on a loopback port: the simulator, the aiohttp floor."""

    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_child(self.process, 10)


def start_simulator(args: list[str], *, timeout: float = 20.0) -> ServerProcess:
    """`python -m simulator ARGS` on a free loopback port, once /health answers 200."""
    return start_server(["simulator", *args, "--host", "127.0.0.1"], timeout=timeout)


def start_server(module_args: list[str], *, timeout: float = 20.0) -> ServerProcess:
    """`python -m MODULE ARGS --port P` on a free loopback port P, once GET /health answers 200."""
    port = free_port()
    argv = [sys.executable, "-m", *module_args, "--port", str(port)]
    server = ServerProcess(spawn(argv, None), port)
    if not wait_ok(server.url + "/health", server.process, module_args[0], timeout=timeout):
        server.stop()
        raise TimeoutError(f"{module_args[0]} not ready within {timeout}s")
    return server

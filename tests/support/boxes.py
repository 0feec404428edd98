"""Two boxes behind a real balancer, for tests/boxes: two mtp-proxy processes (each with its own
simulated backend, or the real patched llama-server), LiteLLM's proxy server from
.balancers/litellm (scripts/install-balancers.sh) and Debian's nginx, each run with the shipped
configuration in deploy/balancers/ (only addresses filled in)."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load import paced_preset, simulator_args
from tests.support.harness import ProxyProcess, free_port, proxy_config, start_proxy

REPO = Path(__file__).resolve().parents[2]
BALANCERS = REPO / "deploy" / "balancers"
LITELLM = REPO / ".balancers" / "litellm" / "bin" / "litellm"
MODEL = "mtp-demo"
TOK_S = 40.0  # the simulated backends decode at exactly this: a request of N tokens holds N/40 s


def box_config(workdir: Path, box: str, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """One box: a model of one simulated process (two slots, paced), box_id ``box``."""
    model = model or {
        "name": MODEL,
        "backend": "simulator",
        "args": simulator_args(paced_preset(workdir, TOK_S), 2),
        "profiles": [{"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}],
    }
    config = proxy_config([model], routing={"box_id": box})
    config["server"]["port"] = free_port()
    return config


@contextmanager
def two_boxes(workdir: Path, model: dict[str, Any] | None = None) -> Iterator[list[ProxyProcess]]:
    boxes = []
    try:
        for n in (1, 2):
            where = workdir / f"box-{n}"
            where.mkdir(parents=True, exist_ok=True)
            boxes.append(start_proxy(box_config(where, f"box-{n}", model), where))
        yield boxes
    finally:
        for box in boxes:
            box.stop()


def kill(box: ProxyProcess) -> None:
    """The box dies at once: the proxy and everything in its process group, SIGKILL."""
    os.killpg(box.process.pid, signal.SIGKILL)
    box.process.wait(10)


@dataclass
class Balancer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    key: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def _spawn(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait(balancer: Balancer, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if balancer.process.poll() is not None:
            raise RuntimeError(f"balancer exited {balancer.process.returncode}:\n{balancer.tail()}")
        try:
            with urllib.request.urlopen(balancer.url + path, timeout=2) as response:
                if response.status < 500:
                    return
        except urllib.error.HTTPError as error:
            if error.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.2)
    balancer.stop()
    raise TimeoutError(f"balancer not up within {timeout}s:\n{balancer.tail()}")


@contextmanager
def litellm(boxes: list[ProxyProcess], workdir: Path) -> Iterator[Balancer]:
    """deploy/balancers/litellm.yaml as shipped, the boxes' URLs in its environment."""
    if not LITELLM.is_file():
        raise RuntimeError(f"{LITELLM} is missing: run scripts/install-balancers.sh")
    key = "sk-boxes-" + secrets.token_hex(8)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "MTP_BOX_1_URL_V1": boxes[0].url + "/v1",
        "MTP_BOX_2_URL_V1": boxes[1].url + "/v1",
        "MTP_PROXY_KEY": "none",
        "LITELLM_MASTER_KEY": key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
        "PYTHONUNBUFFERED": "1",
    }
    port = free_port()
    argv = [str(LITELLM), "--config", str(BALANCERS / "litellm.yaml"), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1", "--telemetry", "False"]
    balancer = Balancer(_spawn(argv, workdir / "litellm.log", env), port, workdir / "litellm.log")
    balancer.key = key
    try:
        _wait(balancer, "/health/liveliness", 180.0)
        yield balancer
    finally:
        balancer.stop()


@contextmanager
def nginx(boxes: list[ProxyProcess], workdir: Path) -> Iterator[Balancer]:
    """deploy/balancers/nginx.conf as shipped, its listen port, pid file and the two servers
    filled in."""
    port = free_port()
    conf = (BALANCERS / "nginx.conf").read_text()
    conf = conf.replace("pid /run/nginx-mtp.pid;", f"pid {workdir / 'nginx.pid'};")
    conf = conf.replace("listen 127.0.0.1:8080;", f"listen 127.0.0.1:{port};")
    for n, box in enumerate(boxes, start=1):
        conf = conf.replace(f"server 127.0.0.1:808{n} ", f"server 127.0.0.1:{box.port} ")
    assert re.findall(r"server 127\.0\.0\.1:(\d+) ", conf) == [str(b.port) for b in boxes]
    path = workdir / "nginx.conf"
    path.write_text(conf)
    argv = ["nginx", "-c", str(path), "-p", str(workdir), "-e", "stderr", "-g", "daemon off;"]
    balancer = Balancer(_spawn(argv, workdir / "nginx.log"), port, workdir / "nginx.log")
    try:
        _wait(balancer, "/health", 20.0)
        yield balancer
    finally:
        balancer.stop()


@contextmanager
def behind(
    kind: str, workdir: Path, model: dict[str, Any] | None = None
) -> Iterator[tuple[Balancer, list[ProxyProcess]]]:
    with ExitStack() as stack:
        boxes = stack.enter_context(two_boxes(workdir, model))
        make = litellm if kind == "litellm" else nginx
        yield stack.enter_context(make(boxes, workdir)), boxes

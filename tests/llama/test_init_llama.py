"""`mtp-proxy init` on a tiny qwen35 GGUF with MTP layers, with the patched llama-server found
through the build script's cache: check-config accepts the file as written, and the proxy
serves it (one process, per-request depths) with nothing changed but the port, the learned file
(given as environment variables, as the systemd unit gives the latter) and the calibration's
length: the tiny model decodes ~2 tok/s beside two busy loops, where 96 tokens at each depth
outlast the wait for ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.processes import ProxyProcess
from tests.support.cli import ROOT
from tests.support.harness import free_port
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35

pytestmark = pytest.mark.llama


def mtp_proxy(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *argv],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_init_then_check_config_then_serve(tmp_path: Path) -> None:
    model = write_qwen35(
        tmp_path / "Tiny-Qwen3.6-MTP.gguf", Qwen35Config(mtp=Mtp.IDENTITY, bigram=True)
    )
    patched = Path(patched_llama_server_binary())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MTP_")},
        "MTP_LLAMA_SERVER_CACHE": str(patched.parents[2]),  # as the build script's cache
        "PATH": "/usr/bin:/bin",  # no llama-server on it
        "PYTHONPATH": str(ROOT),
    }
    config = tmp_path / "config.toml"
    init = mtp_proxy("init", str(model), "--out", str(config), "--gpu-memory", "24", env=env)
    assert init.returncode == 0, init.stderr
    assert f"llama-server: {patched} (The patched llama-server" in init.stderr
    text = config.read_text()
    assert f'binary = "{patched}"' in text and 'default = "tiny-qwen3.6-mtp"' in text

    checked = mtp_proxy("check-config", "--config", str(config), env=env)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{config}: OK\n")
    assert "any other model name: tiny-qwen3.6-mtp" in checked.stdout

    port = free_port()
    serving = {
        **env,
        "MTP_PROXY_SERVER__PORT": str(port),
        "MTP_PROXY_ROUTING__STATE_FILE": str(tmp_path / "learned-stats.json"),
        "MTP_PROXY_ROUTING__CALIBRATION_TOKENS": "16",  # the least allowed (128 took 65 s a run)
        "MTP_PROXY_LOG__FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "proxy.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)],
            cwd=ROOT, env=serving, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    proxy = ProxyProcess(process, log_path, port)
    try:
        proxy.wait_healthy(120)
        body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}
        request = urllib.request.Request(
            proxy.url + "/v1/chat/completions",
            data=json.dumps({**body, "max_tokens": 8}).encode(),
            headers={"Content-Type": "application/json", "X-MTP-Profile": "max"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            served = (response.status, response.headers["X-MTP-Profile"])
            backend = response.headers["X-MTP-Backend"]
        plans = [x for x in proxy.log_lines() if x.get("event") == "backend_probed"]
    finally:
        assert proxy.stop() == 0
    assert served == (200, "max")
    assert backend == "tiny-qwen3.6-mtp/one-copy"
    assert plans and plans[0]["draft_control"] == "per-request"  # the patched build, found
    assert (tmp_path / "learned-stats.json").is_file()  # the learned file the environment chose

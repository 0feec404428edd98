"""`mtp-proxy init` with the patched llama-server found through the build script's cache, on a
tiny qwen35 GGUF with MTP layers (draft-mtp) and on real Gemma 3 270M, which has none (ngram-mod;
draft-simple with --draft-model): check-config accepts the file as written, and the proxy
serves it (one process, per-request depths) with nothing changed but the port, the learned file
(given as environment variables, as the systemd unit gives the latter) and the calibration's
length: the tiny model decodes ~2 tok/s beside two busy loops, where 96 tokens at each depth
outlast the wait for ready. Each llama-server runs one thread (LLAMA_ARG_THREADS, which it reads
as -t)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.processes import ProxyProcess
from tests.support.cli import ROOT
from tests.support.harness import free_port
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.real_models import GEMMA3_270M, SMOLLM2_135M, real_model
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
    env, patched = init_env()
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

    with serving(config, env, tmp_path) as proxy:
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
    assert served == (200, "max")
    assert backend == "tiny-qwen3.6-mtp/one-process"
    assert plans and plans[0]["draft_control"] == "per-request"  # the patched build, found
    assert (tmp_path / "learned-stats.json").is_file()  # the learned file the environment chose


# A line said over and over, the last time cut short: Gemma 270M carries on with it at
# temperature 0, so an n-gram type drafts from the first tokens on (tests/llama/test_spec_types.py).
LINE = (
    "The quick brown fox jumps over the lazy dog while the small grey cat sleeps under the old "
    "wooden table by the open kitchen window.\n"
)
GEMMA_NAME = "gemma-3-270m-q4_k_m"
GEMMA_BACKEND = f"{GEMMA_NAME}/one-process"


def test_init_on_gemma_without_mtp_layers_drafts_with_ngram_mod_through_the_proxy(
    tmp_path: Path,
) -> None:
    gemma = real_model(GEMMA3_270M)
    env, _ = init_env()
    config = tmp_path / "config.toml"
    # 1.5 GiB: the context init sizes stays small (the weights are 0.24 GiB, the KV cache of
    # the trained 32768 tokens would be most of it).
    init = mtp_proxy("init", str(gemma), "--out", str(config), "--gpu-memory", "1.5", env=env)
    assert init.returncode == 0, init.stderr
    assert "drafting: ngram-mod, profiles off / 8 / 16" in init.stderr
    checked = mtp_proxy("check-config", "--config", str(config), env=env)
    assert checked.returncode == 0, checked.stderr
    assert "--spec-type ngram-mod --spec-draft-n-max 16" in checked.stdout

    with serving(config, env, tmp_path) as proxy:
        body = {"prompt": LINE * 5 + "The quick brown fox", "max_tokens": 48, "temperature": 0}
        answer, profile = completion(proxy, body, "max")
        metrics = urllib.request.urlopen(proxy.url + "/metrics", timeout=10).read().decode()
        _, admin = proxy.get_json("/admin/backends", admin_key=admin_key(config))
        status = mtp_proxy("status", "--config", str(config), env=serving_env(env, proxy.port))
    assert profile == "max"
    assert answer["timings"]["draft_n"] > 0, answer["timings"]  # ngram-mod drafted
    assert speculation_series(metrics) == {GEMMA_BACKEND: ("ngram-mod", "")}
    assert drafted_by(metrics, "max") == answer["timings"]["draft_n"]
    assert [(b["name"], b["spec_type"], b["draft_model"]) for b in admin["backends"]] == [
        (GEMMA_BACKEND, "ngram-mod", None)
    ]
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith(GEMMA_BACKEND))
    assert row.split()[1:3] == ["one-process", "ngram-mod"], status.stdout


def test_init_with_a_draft_model_checks_its_vocabulary(tmp_path: Path) -> None:
    gemma, smollm2 = real_model(GEMMA3_270M), real_model(SMOLLM2_135M)
    env, _ = init_env()
    config = tmp_path / "config.toml"
    argv = ["--out", str(config), "--gpu-memory", "1.5"]
    refused = mtp_proxy("init", str(gemma), *argv, "--draft-model", str(smollm2), env=env)
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        f"mtp-proxy init: refused: --draft-model {smollm2} does not share the vocabulary of "
        f"{gemma} (model vs draft: tokenizer.ggml.model 'llama' vs 'gpt2'; "
    )
    assert not config.exists()
    written = mtp_proxy("init", str(gemma), *argv, "--draft-model", str(gemma), env=env)
    assert written.returncode == 0, written.stderr
    assert f"drafting: draft-simple (draft model {gemma}), profiles off / 8 / 16" in (
        written.stderr
    )
    profiles = tomllib.loads(config.read_text())["models"][0]["profiles"]
    assert [(p.get("spec_type"), p.get("draft_model"), p.get("draft_n_max")) for p in profiles] == [
        (None, None, None),
        ("draft-simple", str(gemma), 8),
        ("draft-simple", str(gemma), 16),
    ]
    checked = mtp_proxy("check-config", "--config", str(config), env=env)
    assert checked.returncode == 0, checked.stderr
    assert f"--spec-type draft-simple -md {gemma} --spec-draft-n-max 16" in checked.stdout


# --- helpers ------------------------------------------------------------------------------------


def init_env() -> tuple[dict[str, str], Path]:
    """The environment init and the proxy run in: the patched build found as the build script's
    cache, no llama-server on PATH; and the patched binary."""
    patched = Path(patched_llama_server_binary())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MTP_")},
        "MTP_LLAMA_SERVER_CACHE": str(patched.parents[2]),  # as the build script's cache
        "PATH": "/usr/bin:/bin",  # no llama-server on it
        "PYTHONPATH": str(ROOT),
        "LLAMA_ARG_THREADS": "1",  # -t 1 for every llama-server the proxy starts
    }
    return env, patched


def serving_env(env: dict[str, str], port: int) -> dict[str, str]:
    return {**env, "MTP_PROXY_SERVER__PORT": str(port)}


@contextmanager
def serving(config: Path, env: dict[str, str], tmp_path: Path) -> Iterator[ProxyProcess]:
    """`mtp-proxy serve --config` with the port, the learned file and a short calibration set
    by environment variables; stopped cleanly at the end."""
    port = free_port()
    serving = {
        **serving_env(env, port),
        "MTP_PROXY_ROUTING__LEARNED_FILE": str(tmp_path / "learned-stats.json"),
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
        proxy.wait_healthy(180)
        yield proxy
    finally:
        assert proxy.stop() == 0


def completion(proxy: ProxyProcess, body: dict[str, object], profile: str) -> tuple[Any, str]:
    request = urllib.request.Request(
        proxy.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-MTP-Profile": profile},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), response.headers["X-MTP-Profile"]


def admin_key(config: Path) -> str:
    key: str = tomllib.loads(config.read_text())["server"]["admin_key"]
    return key


def speculation_series(metrics: str) -> dict[str, tuple[str, str]]:
    return {
        sample.labels["backend"]: (sample.labels["spec_type"], sample.labels["draft_model"])
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_speculation_info" and sample.value == 1
    }


def drafted_by(metrics: str, profile: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "mtp_proxy_draft_tokens_total" and sample.labels["profile"] == profile
    )

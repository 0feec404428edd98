"""Where the GPU memory check shows: check-config's output and serve's log, run for real.

No GPU here: free memory comes from a stand-in nvidia-smi (a script printing MiB per GPU), and
model files are sparse files of the wanted size (a GGUF header and a hole). The estimates and
the warning themselves: tests/unit/test_preflight.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomli_w

from supervisor.memory import GIB, MIB
from tests.support.cli import run_cli
from tests.support.fake_gpu import fake_nvidia_smi, sparse
from tests.support.harness import running_proxy
from tests.support.llama_pool import PROFILES, identity_model, llama_config, log_events


def write_config(tmp_path: Path, model_path: Path) -> Path:
    config = llama_config(model_path)
    config["models"][0]["args"] = ["-c", "8192"]
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def test_check_config_prints_the_estimate_and_warns(tmp_path: Path) -> None:
    config = write_config(tmp_path, sparse(tmp_path / "m.gguf", 8 * GIB))
    result = run_cli(
        "check-config", str(config), path_dir=fake_nvidia_smi(tmp_path / "bin", 16_000)
    )
    assert result.returncode == 0, result.stderr  # a warning, not an error
    assert "gpu memory: the backends need ~27.25 GiB" in result.stdout  # 3 x (8 GiB + KV + drafts)
    assert "free: 15.62 GiB on 1 GPU(s)" in result.stdout
    assert "  tiny/max: ~9.17 GiB (model 8.00 GiB, ctx 8192, draft n_max 3)" in result.stdout
    warnings = result.stderr.splitlines()
    assert any(w.startswith("warning: the backends need ~27.2 GiB") for w in warnings), warnings
    assert "llama-server will offload layers to the CPU" in result.stderr


def test_check_config_without_nvidia_smi_says_not_checked(tmp_path: Path) -> None:
    config = write_config(tmp_path, sparse(tmp_path / "m.gguf", 8 * GIB))
    empty = tmp_path / "empty-path"
    empty.mkdir()
    result = run_cli("check-config", str(config), path_dir=empty)
    assert result.returncode == 0, result.stderr
    assert "free: unknown (no nvidia-smi), not checked" in result.stdout
    assert "the backends need" not in result.stderr  # no memory warning: nothing to check


def test_serve_logs_the_warning_at_start_and_serves_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_nvidia_smi(tmp_path / "bin", 100)  # 100 MiB free: not even the headroom fits
    monkeypatch.setenv("PATH", f"{fake}:{Path(sys.executable).parent}")
    config = llama_config(identity_model(tmp_path / "models"), profiles=[PROFILES[2]])
    with running_proxy(config, tmp_path / "proxy") as proxy:
        status, _ = proxy.get_json("/health")
        check = log_events(proxy, "gpu_memory_check")
        warnings = log_events(proxy, "gpu_memory_warning")
    assert status == 200
    assert check[0]["free_bytes"] == 100 * MIB
    assert check[0]["backends"]["tiny/max"] == check[0]["need_bytes"] > 0
    assert warnings[0]["level"] == "warning"
    assert "only 0.1 GiB is free" in warnings[0]["message"]

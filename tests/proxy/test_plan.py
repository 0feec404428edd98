"""The plan as `mtp-proxy check-config` prints it, run for real (which shape serves a model's
profiles, and its processes: tests/unit/test_plan.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.memory import GIB
from tests.support.cli import run_cli
from tests.support.fake_gpu import fake_nvidia_smi, sparse
from tests.support.plan_config import write


def test_check_config_prints_the_plan(tmp_path: Path) -> None:
    result = run_cli("check-config", str(write(tmp_path)))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "shape: one process per replica (1 process" in out
    assert 'per-request depths ("speculative.n_max"): off = 0, min = 2, max = 3' in out
    assert "if the probe says the backend ignores the field" in out
    assert "m/one-process: " in out and "--spec-draft-n-max 3" in out
    assert "gpu memory:" in out


def test_check_config_exits_2_for_a_profile_deeper_than_the_process(tmp_path: Path) -> None:
    result = run_cli("check-config", str(write(tmp_path, draft_n_max=2)))
    assert result.returncode == 2
    assert "depth 3 is above the process's start-up depth 2" in result.stderr


def test_check_config_says_whether_autos_fallback_pool_would_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = fake_nvidia_smi(tmp_path / "smi", 12 * 1024)
    monkeypatch.setenv("PATH", f"{smi}:{os.environ.get('PATH', '')}")
    path = write(
        tmp_path,
        backend="llama-server",
        binary="/bin/true",
        model_path=str(sparse(tmp_path / "m.gguf", 8 * GIB)),
        args=["-c", "8192"],
    )
    result = run_cli("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert "the pool does not fit: pool ~" in result.stdout
    assert "m/one-process: ~" in result.stdout  # the estimate of the one process that starts

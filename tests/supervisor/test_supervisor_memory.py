"""Free GPU memory as nvidia-smi reports it: a stand-in nvidia-smi script, run for real (the
estimates and the warning: tests/unit/test_supervisor_memory.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from supervisor.memory import MIB, query_free_gpu_bytes


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_free_gpu_memory_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args_file = tmp_path / "args"
    _script(tmp_path / "nvidia-smi", f'echo "$@" > {args_file}\nprintf "24000\\n 1024\\n"')
    monkeypatch.setenv("PATH", str(tmp_path))
    assert query_free_gpu_bytes() == [24000 * MIB, 1024 * MIB]
    assert args_file.read_text().split() == [
        "--query-gpu=memory.free",
        "--format=csv,noheader,nounits",
    ]


def test_free_gpu_memory_errors_are_none(tmp_path: Path) -> None:
    failing = _script(tmp_path / "smi-fails", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert query_free_gpu_bytes(str(failing)) is None
    garbage = _script(tmp_path / "smi-garbage", "echo '[N/A]'")
    assert query_free_gpu_bytes(str(garbage)) is None
    slow = _script(tmp_path / "smi-slow", "sleep 5")
    assert query_free_gpu_bytes(str(slow), timeout_s=0.2) is None

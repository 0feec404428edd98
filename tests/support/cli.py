"""`mtp-proxy` run as a user runs it: its own process, its output and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, path_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m proxy.cli ARGS``; with ``path_dir``, that folder is the whole PATH (the
    programs the command may find there, nvidia-smi say, are the test's)."""
    env = None if path_dir is None else {"PATH": str(path_dir), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )

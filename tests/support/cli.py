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


def version_only_llama_server(path: Path) -> Path:
    """A stand-in binary that answers --version as llama-server does (on stderr) and nothing
    else: what `init --binary` checks, for tests that never start it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then\n'
        '  echo "version: 1 (0000000)" >&2; echo "built with cc for x86_64" >&2\nfi\n'
    )
    path.chmod(0o755)
    return path

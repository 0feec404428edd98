"""A GPU box without a GPU: model files of any size that take no disk, and a stand-in nvidia-smi."""

from __future__ import annotations

import stat
from pathlib import Path


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as handle:
        handle.truncate(size)  # no disk used: only the size matters
    return path


def fake_nvidia_smi(directory: Path, *free_mib: int) -> Path:
    """A stand-in nvidia-smi on a PATH of its own, printing free MiB per GPU as the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    lines = "\\n".join(str(mib) for mib in free_mib)
    script.write_text(f'#!/bin/sh\nprintf "{lines}\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory

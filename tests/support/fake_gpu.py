"""A GPU box without a GPU: model files of any size that take no disk, and a stand-in nvidia-smi."""

from __future__ import annotations

import stat
import struct
from pathlib import Path


def sparse(path: Path, size: int) -> Path:
    """A GGUF of ``size`` bytes that holds nothing but a header: a qwen35 model with one MTP
    layer (the proxy reads that much: `serve` refuses a model file that is no GGUF, and
    check-config one without the MTP layers its profiles draft with), then a hole."""
    entries = _string("general.architecture") + struct.pack("<I", 8) + _string("qwen35")
    entries += _string("qwen35.nextn_predict_layers") + struct.pack("<II", 4, 1)
    with path.open("wb") as handle:
        handle.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + entries)  # v3, no tensor
        handle.truncate(size)  # no disk used: only the size matters
    return path


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def fake_nvidia_smi(directory: Path, *free_mib: int) -> Path:
    """A stand-in nvidia-smi on a PATH of its own, printing free MiB per GPU as the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "nvidia-smi"
    lines = "\\n".join(str(mib) for mib in free_mib)
    script.write_text(f'#!/bin/sh\nprintf "{lines}\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory

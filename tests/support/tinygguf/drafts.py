"""Tiny GGUFs that say they are draft models of a kind (EAGLE3, DFlash, DSpark): the metadata and
tensor names llama.cpp reads to tell them apart, no weights worth loading. For the checks that
read a draft model's kind before anything starts (proxy.plans.draft_models), not for a server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .weights import write_gguf


def write_draft_head(
    path: Path,
    arch: str,
    *,
    target_layers: tuple[int, ...] = (),
    tensors: tuple[str, ...] = ("fc.weight",),
) -> Path:
    """A GGUF of architecture ``arch`` with ``<arch>.target_layers`` (when given) and one small
    F32 tensor per name."""

    def fill(writer: GGUFWriter) -> None:
        writer.add_name(f"tiny {arch} draft")
        writer.add_block_count(1)
        if target_layers:
            writer.add_array(f"{arch}.target_layers", list(target_layers))
        for name in tensors:
            writer.add_tensor(name, np.zeros((4, 4), dtype=np.float32))

    return write_gguf(path, arch, fill)

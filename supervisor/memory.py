"""Rough GPU memory needs of the backends, to warn before llama-server spills layers to the CPU.

The estimate is deliberately simple and errs high: a warning that turns out unneeded costs a
glance, backends that silently do not fit cost most of their speed (figures:
docs/published-figures.md#setup-a).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Mapping

MIB = 1024 * 1024
GIB = 1024 * MIB

# When the architecture is unknown: f16 KV bytes per context token per byte of weights.
# 1/65536 gives 256 KiB/token for a 16 GiB file (Qwen2.5-32B-class dense models with GQA);
# an overestimate for hybrid models (Qwen3.5/3.6: few full-attention layers), on purpose.
_KV_BYTES_PER_TOKEN_PER_MODEL_BYTE = 1 / 65536
_DEFAULT_LAYERS = 48  # only to apportion the heuristic KV cache to one (MTP) layer

# Published (docs/published-figures.md#setup-a): compute buffer ~294 MB at 10 draft tokens ->
# ~30 MiB per draft token, and n_max >= 3 already adds 150+ MB. Keep >= 500 MB free for 5-10
# draft tokens.
_COMPUTE_BYTES_PER_DRAFT_TOKEN = 30 * MIB
_COMPUTE_FLOOR_AT_3_DRAFTS = 150 * MIB
DRAFT_HEADROOM_BYTES = 500 * MIB


def estimate_vram_bytes(
    model_file_size: int,
    n_ctx: int,
    *,
    n_layers: int | None = None,
    n_embd: int | None = None,
    n_embd_kv: int | None = None,
    draft_n_max: int = 0,
    kv_bytes_per_value: float = 2.0,
) -> int:
    """Bytes one llama-server needs on the GPU: weights + KV cache + MTP draft buffers.

    ``n_embd_kv`` is the K (or V) width per layer (n_embd * n_head_kv / n_head with GQA);
    it defaults to ``n_embd`` (no GQA: an overestimate). Unknown shapes use a heuristic.
    ``kv_bytes_per_value`` is 2 for f16 KV, ~1.06 for q8_0.
    """
    if model_file_size < 0 or n_ctx < 0 or draft_n_max < 0:
        raise ValueError("sizes must not be negative")
    kv_width = n_embd_kv if n_embd_kv is not None else n_embd
    if n_layers is not None and kv_width is not None:
        # K and V for every layer and every context position.
        kv_per_token_per_layer = 2 * kv_width * kv_bytes_per_value
        kv_cache = kv_per_token_per_layer * n_layers * n_ctx
    else:
        kv_per_token = model_file_size * _KV_BYTES_PER_TOKEN_PER_MODEL_BYTE
        kv_cache = kv_per_token * n_ctx
        kv_per_token_per_layer = kv_per_token / (n_layers or _DEFAULT_LAYERS)
    return (
        model_file_size
        + math.ceil(kv_cache)
        + mtp_buffer_bytes(
            n_ctx, draft_n_max, n_embd=n_embd, kv_per_token_per_layer=kv_per_token_per_layer
        )
    )


def mtp_buffer_bytes(
    n_ctx: int, draft_n_max: int, *, n_embd: int | None, kv_per_token_per_layer: float
) -> int:
    """Extra memory of speculation: the draft layer's KV cache plus the larger compute buffer.

    The MTP block is one more attention layer: ~4 x n_embd bytes (f16 K and V) per token it
    keeps, for every context position.
    """
    if draft_n_max == 0:
        return 0
    per_token = 4 * n_embd if n_embd is not None else kv_per_token_per_layer
    draft_kv = per_token * n_ctx
    compute = draft_n_max * _COMPUTE_BYTES_PER_DRAFT_TOKEN
    if draft_n_max >= 3:
        compute = max(compute, _COMPUTE_FLOOR_AT_3_DRAFTS)
    return math.ceil(draft_kv) + compute


def check_backends_fit(
    estimates: Mapping[str, int],
    free_bytes: int | None,
    *,
    headroom_bytes: int = DRAFT_HEADROOM_BYTES,
) -> list[str]:
    """Warnings (empty if they fit, or if free memory is unknown) for backends on one GPU."""
    if free_bytes is None or not estimates:
        return []
    warnings = []
    total = sum(estimates.values())
    if total + headroom_bytes > free_bytes:
        parts = ", ".join(f"{name} ~{_gib(size)}" for name, size in estimates.items())
        warnings.append(
            f"the backends need ~{_gib(total)} of GPU memory ({parts}) plus "
            f"{_gib(headroom_bytes)} headroom for draft buffers, but only {_gib(free_bytes)} "
            "is free: llama-server will offload layers to the CPU and decode far slower. "
            "Use fewer profiles or replicas, a smaller context (-c), or a quantized KV cache."
        )
    for name, size in estimates.items():
        if size > free_bytes:
            warnings.append(
                f"backend {name} alone needs ~{_gib(size)}, more than the {_gib(free_bytes)} free"
            )
    return warnings


def query_free_gpu_bytes(
    nvidia_smi: str | None = None, *, timeout_s: float = 5.0
) -> list[int] | None:
    """Free memory of each GPU in bytes via nvidia-smi, or None without nvidia-smi or on error.

    Blocking (a subprocess with a timeout): call it at start-up or from a thread.
    """
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        result = subprocess.run(
            [binary, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        values = [int(line.strip()) * MIB for line in result.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return values or None


def _gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"

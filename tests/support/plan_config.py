"""A simulated model with the three usual profiles (off, min, max), and its config file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

OFF_MIN_MAX: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]


def write(tmp_path: Path, **fields: Any) -> Path:
    """config.toml of model "m" with OFF_MIN_MAX; ``fields`` add to or replace the model's."""
    path = tmp_path / "config.toml"
    entry = {"name": "m", "backend": "simulator", "profiles": OFF_MIN_MAX, **fields}
    path.write_text(tomli_w.dumps({"models": [entry]}))
    return path

"""The start-up calibration on the real llama-server: the patched build (it honours the depth)
is measured before it is announced ready and a restart finds the measurement in the learned file;
the stock build (it ignores the depth) is not measured at all.

The tiny qwen35 model's MTP block drafts what its trunk says, so every draft is accepted: the
deepest depth alone must measure acceptance 1.0, and depth 0 must draft nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import llama_server_binary, patched_llama_server_binary
from tests.support.llama_pool import MODEL, identity_model, llama_config, llama_model

pytestmark = pytest.mark.llama

BACKEND = f"{MODEL}/one-process"
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]


def config(model: Path, binary: str, state: Path) -> dict[str, Any]:
    entry = llama_model(model, profiles=PROFILES, draft_control="per-request")
    out = llama_config(model, models=[{**entry, "binary": binary}])
    out["routing"] = {"learned_file": str(state), "calibration_tokens": 32}
    return out


def events(proxy: ProxyProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == name]


def test_the_patched_build_is_calibrated_once(tmp_path: Path) -> None:
    model = identity_model(tmp_path / "models")
    state = tmp_path / "state.json"
    binary = patched_llama_server_binary()
    with running_proxy(config(model, binary, state), tmp_path / "first") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        found = routing["calibration"][BACKEND]
        cells = {(c["load"], c["depth"]): c for c in found["cells"]}
        assert set(cells) == {(1, 0), (1, 3), (2, 0), (2, 3)}  # alone and -np 2, depths 0 and 3
        assert cells[(1, 3)]["acceptance"] == 1.0  # the identity block: every draft accepted
        assert cells[(1, 0)]["acceptance"] is None and cells[(2, 0)]["acceptance"] is None
        assert all(c["tok_s"] > 0 for c in cells.values())
        assert found["binary"] == binary and found["model"] == str(model)
        assert found["tokens"] == 32 and found["slots"] == 2
        [done] = events(proxy, "calibrated")
        assert done["levels"] == found["levels"]
    with running_proxy(config(model, binary, state), tmp_path / "second") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert routing["calibration"][BACKEND] == found
        assert events(proxy, "calibration_cached") and not events(proxy, "calibrating")


def test_the_stock_build_is_not_calibrated(tmp_path: Path) -> None:
    """It ignores "speculative.n_max": depth 0 would draft all the same, so there is nothing to
    measure (and auto falls back to the pool; here draft_control is per-request by hand)."""
    model = identity_model(tmp_path / "models")
    cfg = config(model, llama_server_binary(), tmp_path / "state.json")
    with running_proxy(cfg, tmp_path / "stock") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        assert routing["calibration"] == {} and not events(proxy, "calibrating")

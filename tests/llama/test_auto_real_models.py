"""draft_control = "auto" through the proxy on real models and the patched llama-server.

- An n-gram type on Gemma 3 270M: the probe sees the field honoured (an n-gram drafter drafts
  only what it finds earlier in the text, so a probe that read "nothing drafted" as "ignored"
  would send this model to a pool of three processes). The one process stays, and the start-up
  calibration measures it before it is announced ready.
- SmolLM2 as Gemma's draft model: llama-server refuses it (their vocabularies differ) and serves
  without speculation. The probe drafts nothing, with the field or without, so it cannot tell:
  the one process stays (a pool of processes that draft nothing would only cost memory), and the
  log says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.llama_pool import MODEL, llama_config, llama_model
from tests.support.real_models import GEMMA3_270M, SMOLLM2_135M, real_model

pytestmark = pytest.mark.llama

BACKEND = f"{MODEL}/one-process"
ARGS = ["-c", "4096", "-np", "2", "-t", "1"]


def auto_config(tmp_path: Path, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    gemma = real_model(GEMMA3_270M)
    entry = llama_model(gemma, profiles=profiles, args=ARGS, draft_control="auto")
    config = llama_config(
        gemma,
        models=[{**entry, "binary": patched_llama_server_binary()}],
        supervisor={"probe_timeout_s": 60.0, "ready_timeout_s": 120.0},
    )
    config["routing"] = {"learned_file": str(tmp_path / "state.json"), "calibration_tokens": 16}
    return config


def events(proxy: ProxyProcess, name: str) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == name]


def backends(proxy: ProxyProcess) -> list[dict[str, Any]]:
    status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200
    rows: list[dict[str, Any]] = payload["backends"]
    return rows


def test_auto_keeps_one_process_for_an_ngram_type_and_calibrates_it(tmp_path: Path) -> None:
    profiles = [
        {"name": "off"},
        {"name": "min", "spec_type": "ngram-mod", "draft_n_max": 4},
        {"name": "max", "spec_type": "ngram-mod", "draft_n_max": 16},
    ]
    with running_proxy(auto_config(tmp_path, profiles), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=180)
        rows = backends(proxy)
        assert [(r["name"], r["draft_control"]) for r in rows] == [(BACKEND, "per-request")], rows
        assert not events(proxy, "plan_fallback")
        [calibrated] = events(proxy, "calibrated")
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        cells = routing["calibration"][BACKEND]["cells"]
        assert {c["depth"] for c in cells} == {0, 16}, cells
        assert calibrated["levels"]


def test_auto_keeps_one_process_when_the_probe_drafted_nothing(tmp_path: Path) -> None:
    smollm2 = str(real_model(SMOLLM2_135M))
    profiles = [
        {"name": "off"},
        {"name": "max", "spec_type": "draft-simple", "draft_model": smollm2, "draft_n_max": 4},
    ]
    with running_proxy(auto_config(tmp_path, profiles), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=180)
        rows = backends(proxy)
        assert [(r["name"], r["draft_control"]) for r in rows] == [(BACKEND, "undecided")], rows
        assert "drafted nothing" in rows[0]["draft_control_reason"]
        assert not events(proxy, "plan_fallback")
        [undecided] = events(proxy, "plan_undecided")
        assert undecided["level"] == "warning" and "drafted nothing" in undecided["message"]
        decided = [e for e in events(proxy, "plan") if "shape" in e]
        assert decided[-1]["shape"] == "one-process" and "cannot tell" in decided[-1]["why"]
        assert not events(proxy, "calibrating")  # nothing to measure: nothing is drafted

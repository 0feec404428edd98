"""`python -m bench.real_routing --quick` for real: proxies in front of the patched llama-server
on Gemma 3 270M, one round of each scenario; the report's shape and sanity, not its speeds (the
report's arithmetic: tests/unit/test_real_routing_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.real_routing import QUICK
from bench.real_routing_trace import CLASSES
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.real_models import GEMMA3_270M, real_model

pytestmark = [pytest.mark.llama, pytest.mark.timeout(1500)]  # ~3 min alone, 10+ on a busy box

CHECKOUT = Path(__file__).resolve().parents[2]
CONCURRENT_REQUESTS = 8  # a concurrent round: every class and a second edit and chat


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """One quick run for the tests of this module: its printed report and its JSON."""
    out = tmp_path_factory.mktemp("real-routing") / "report.json"
    argv = [sys.executable, "-m", "bench.real_routing", "--quick", "--out", str(out)]
    argv += ["--llama-server", patched_llama_server_binary()]
    argv += ["--model", str(real_model(GEMMA3_270M))]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=1200, cwd=CHECKOUT, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    return done.stdout, json.loads(out.read_text())


def test_the_quick_run_measures_every_arm_class_and_scenario(
    quick: tuple[str, dict[str, Any]],
) -> None:
    printed, report = quick
    arms = list(QUICK["arms"])
    assert report["errors"] == [] and report["arms"] == arms
    assert printed.startswith("HEADLINE: adaptive / best static")
    heads = {row["trace"]: row for row in report["headline"]}
    assert list(heads) == ["alone", "concurrent", "draft-simple control"]
    for row in heads.values():
        assert row["adaptive_tok_s"] > 0 and row["best_static_tok_s"] > 0
        assert row["adaptive_vs_best_static"] == pytest.approx(
            row["adaptive_tok_s"] / row["best_static_tok_s"],
            rel=0.05,  # speeds: 2 decimals
        )
    for name, scenario in report["scenarios"].items():
        assert list(scenario["classes"]) == list(CLASSES), name
        for row in scenario["classes"].values():
            assert all(row["tok_s"][arm] > 0 for arm in arms), (name, row)
            assert row["best_static"] in ("static:off", "static:max")
    assert report["scenarios"]["alone"]["mean_load"] == 1.0
    assert report["scenarios"]["concurrent"]["mean_load"] > 1.5  # four clients at once
    records = report["records"]
    concurrent = [r for r in records if r["scenario"] == "concurrent"]
    assert len(concurrent) == CONCURRENT_REQUESTS * len(arms)


def test_the_quick_run_records(quick: tuple[str, dict[str, Any]]) -> None:
    """Pinned arms ran at their profile; depth 0 drafted nothing; the proxy logged a class for
    every request; only the adaptive arm was calibrated, at depths 0 and 16."""
    report = quick[1]
    for r in report["records"]:
        assert r["proxy_class"], r
        if r["arm"].startswith("static:"):
            assert (r["profile"], r["reason"]) == (r["arm"].removeprefix("static:"), "pinned")
        if r["profile"] == "off":
            assert not r["acceptance"], r  # nothing drafted at depth 0
    calibrated = report["calibration"]["ngram-mod adaptive"]
    [verdict] = calibrated.values()
    assert {c["depth"] for c in verdict["cells"]} == {0, 16}
    assert set(verdict["levels"]) == {"1", "2", "4"}
    classes = report["classifier"]
    assert list(classes) == list(CLASSES)
    assert all(sum(row["proxy_classes"].values()) > 0 for row in classes.values())


def test_the_quick_run_draft_control(quick: tuple[str, dict[str, Any]]) -> None:
    report = quick[1]
    control = report["draft_control"]
    assert control["tok_s"]["static:off"] > 0 and control["tok_s"]["adaptive"] > 0
    assert len(control["adaptive_sequence"]) == len(CLASSES) - 1  # the one-shot classes once
    assert set(control["adaptive_sequence"]) <= {"off", "min", "max"}
    backends = report["backends"]
    assert set(backends) == {"ngram-mod", "draft-simple"}
    for rows in backends["ngram-mod"].values():
        assert [r["draft_control"] for r in rows] == ["per-request"]

"""bench/abuse_items.py, bounded for CI: one client sending 2 MiB bodies of tiny items for a
second; every body is refused (413) and the report holds every figure the benchmark promises.
Its figures themselves are not judged here (a loaded machine moves them): docs/benchmarks.md."""

from __future__ import annotations

import json

import pytest

from bench import abuse_items


def test_the_items_benchmark_reports_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert abuse_items.main(["--clients", "1", "--mib", "2", "--seconds", "1", "--json"]) == 0
    (side,) = json.loads(capsys.readouterr().out).values()
    answers = side["body_answers"]
    assert set(answers) == {"413"} and answers["413"] >= 1, answers
    for probes in (side["health_quiet"], side["health_flood"]):
        assert probes["errors"] == 0 and probes["probes"] >= 1
        assert 0 < probes["p50_ms"] <= probes["p99_ms"] <= probes["worst_ms"]
    assert side["in_flight_mib"] == 2
    assert side["peak_rss_mib"] >= side["rss_before_mib"] > 0

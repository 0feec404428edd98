"""bench.overhead's printed table: a figure a workload does not have reads "-", not "nanms"."""

from __future__ import annotations

import pytest

from bench import overhead


def row(workload: str, gap_ms: float) -> dict[str, object]:
    return {
        "workload": workload,
        "concurrency": 4,
        "samples": 32,
        "path": "mtp-proxy",
        "added_p50_ms": 1.03,
        "added_p99_ms": 2.5,
        "added_p50_rounds_ms": [1.0, 1.1],
        "ratio": 0.99,
        "added_gap_p99_ms": gap_ms,
        "cpu_s_per_1k": 0.8,
        "errors": 0,
    }


def test_a_workload_that_does_not_stream_has_no_gap_between_chunks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = {"table": [row("small", float("nan")), row("stream", 0.42)], "sustained": []}
    overhead.print_report({**report, "tok_s": 100.0}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    small = next(line.split() for line in lines if line.split()[:1] == ["small"])
    stream = next(line.split() for line in lines if line.split()[:1] == ["stream"])
    assert small[8] == "-" and stream[8] == "0.42ms"
    assert not any("nan" in line for line in lines)

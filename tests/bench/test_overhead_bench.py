"""bench/overhead.py, bounded for CI: every path (direct, mtp-proxy, the aiohttp floor) answers
the same small and streamed load without errors, tokens arrive in full through each proxy, and
the report holds every figure the benchmark promises. LiteLLM is left out (an optional extra)."""

from __future__ import annotations

import json
import math

import pytest

from bench import overhead


def test_overhead_benchmark_measures_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--levels", "4", "--rounds", "1", "--tok-s", "2000", "--tokens", "32"]
    argv += ["--search", "16", "--search-s", "0.2", "--no-litellm", "--json"]
    assert overhead.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["workload"], r["path"]): r for r in report["table"]}
    assert set(rows) == {
        (workload, path)
        for workload in ("small", "stream")
        for path in ("mtp-proxy", overhead.FLOOR)
    }
    for row in rows.values():
        assert row["errors"] == 0
        assert row["samples"] == {"small": 400, "stream": 32}[row["workload"]]  # all measured
        assert 0.5 < row["ratio"] < 2.0  # tokens/s (streams) or requests/s within reason
        assert row["cpu_s_per_1k"] > 0  # the proxy's own CPU time was read
    for path in ("mtp-proxy", overhead.FLOOR):
        assert math.isfinite(rows[("stream", path)]["added_gap_p99_ms"])
    [(level, ratio, direct_rate, proxied_rate)] = report["sustained"]
    assert level == 16 and direct_rate > 0 and proxied_rate > 0 and ratio > 0.5

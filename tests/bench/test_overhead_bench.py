"""bench/overhead.py, bounded for CI: every path (direct, mtp-proxy, the proxy with a live page
open, the aiohttp floor) answers the same small and streamed load without errors, tokens arrive
in full through each proxy, the report holds every figure the benchmark promises, and the page's
reader got answers from every admin endpoint the page reads, at the page's cadence. LiteLLM is
left out (an optional extra)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from bench import overhead

APP_JS = Path(overhead.__file__).parents[1] / "proxy" / "ui" / "static" / "app.js"
PAGE_READS = ("backends", "depths", "requests", "routing", "chart", "drafting")


def test_overhead_benchmark_measures_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--levels", "4", "--rounds", "1", "--tok-s", "2000", "--tokens", "32"]
    argv += ["--search", "16", "--search-s", "0.2", "--no-litellm", "--live-page", "--json"]
    assert overhead.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["workload"], r["path"]): r for r in report["table"]}
    assert set(rows) == {
        (workload, path)
        for workload in ("small", "stream")
        for path in ("mtp-proxy", overhead.PAGE, overhead.FLOOR)
    }
    for row in rows.values():
        assert row["errors"] == 0
        assert row["samples"] == {"small": 400, "stream": 32}[row["workload"]]  # all measured
        # tokens/s (streams) or requests/s within reason: a sanity bound, wide for a loaded
        # machine (the figures themselves are docs/benchmarks.md's)
        assert 0.3 < row["ratio"] < 3.0
        assert row["cpu_s_per_1k"] > 0  # the proxy's own CPU time was read
        low, high = row["added_p50_rounds_ms"]
        assert math.isfinite(low) and low <= high
    for path in ("mtp-proxy", overhead.PAGE, overhead.FLOOR):
        assert math.isfinite(rows[("stream", path)]["added_gap_p99_ms"])
    [(level, ratio, direct_rate, proxied_rate)] = report["sustained"]
    assert level == 16 and direct_rate > 0 and proxied_rate > 0 and ratio > 0.5
    # The page's twin was read as the page reads: every endpoint answered 200, nothing else.
    [(name, statuses)] = report["live_page"].items()
    assert name == overhead.PAGE
    assert all(answer.endswith(" 200") for answer in statuses), statuses
    for path in PAGE_READS:
        assert statuses.get(f"/admin/{path} 200", 0) >= 1, statuses
    for path in overhead.PAGE_FILES:
        assert statuses.get(f"{path} 200") == 1, statuses


def test_the_page_reader_keeps_the_pages_cadence() -> None:
    """The bench's reader asks at the pace of proxy/ui/static/app.js, and for the same paths."""
    script = APP_JS.read_text()

    def constant(name: str) -> int:
        match = re.search(rf"const {name} = (\d+);", script)
        assert match, name
        return int(match.group(1))

    assert constant("POLL_MS") == overhead.PAGE_POLL_S * 1000
    assert constant("SLOW_EVERY") == overhead.PAGE_SLOW_EVERY
    assert constant("KEEP_ROWS") == overhead.PAGE_KEEP_ROWS
    assert set(re.findall(r'api\(["`](\w+)', script)) == set(PAGE_READS)

"""The routing benchmark run for real: `python -m bench.routing` on tiny traces, one and several
(the trace format, the traces, the reference policies and the report:
tests/unit/test_routing_bench.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import trace_gen
from bench.routing_report import ratios
from proxy.workloads.trace import write_trace

CHECKOUT = Path(__file__).resolve().parents[2]  # bench/ runs from a checkout (not in the wheel)
SMOKE_POLICIES = (
    "static:off",
    "static:min",
    "static:max",
    "adaptive",
    "hindsight",
    "greedy",
    "pool",
)
SMOKE_TOPOLOGY = "one-process"
SUMMARY_KEYS = {
    "requests",
    "errors",
    "output_tokens",
    "goodput_tok_s",
    "decode_tok_s",
    "latency_mean_s",
    "latency_p95_s",
    "wall_s",
    "mix",
    "reasons",
}


def test_benchmark_smoke_run(tmp_path: Path) -> None:
    trace = trace_gen.tiny_concurrent_trace()
    path = tmp_path / "tiny.jsonl"
    write_trace(path, trace)
    argv = [sys.executable, "-m", "bench.routing", "--trace", str(path), "--preset", "setup-b"]
    argv += ["--time-scale", "200", "--json", "--policies", ",".join(SMOKE_POLICIES)]
    argv += ["--topology", SMOKE_TOPOLOGY]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=CHECKOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["requests"], report["topology"]) == (len(trace), SMOKE_TOPOLOGY)
    assert report["trace"] == str(path) and "mean" not in report  # one run: nothing to average
    entry = report["runs"][0]["setup-b"]
    policies = entry["policies"]
    assert set(policies) == set(SMOKE_POLICIES)
    for summary in policies.values():
        assert set(summary) == SUMMARY_KEYS
        assert (summary["requests"], summary["errors"]) == (report["requests"], 0)
        assert summary["goodput_tok_s"] > 0 and summary["latency_p95_s"] > 0
    assert policies["static:off"]["mix"] == {"off": report["requests"]}
    assert policies["static:off"]["reasons"] == {"pinned": report["requests"]}
    assert set(entry["ratios"]) >= {
        "best_static",
        "adaptive_vs_oracle",
        "adaptive_vs_best_static",
        "rules_vs_best_static",
        "meets_targets",
    }
    # the reference: every request has its class (from the proxy's log), sub-agents ran at once
    cells = entry["reference"]["cells"]
    for profile in ("off", "min", "max"):
        assert sum(c["static"].get(profile, {}).get("requests", 0) for c in cells) == len(trace)
    assert all(c["class"] != "?" for c in cells)
    assert any(c["load"] != "1" for c in cells)
    picks = {c["pick"] for c in cells}
    # hindsight's requests went where its cells say (live loads may differ from the statics')
    assert set(policies["hindsight"]["mix"]) <= picks | {entry["reference"]["fallback"]}
    assert entry["ratios"]["oracle_vs_best_static"] >= 1.0
    fallback = entry["reference"]["fallback"]
    assert policies[f"static:{fallback}"]["goodput_tok_s"] == max(
        policies[f"static:{p}"]["goodput_tok_s"] for p in ("off", "min", "max")
    )
    for cell in cells:  # a cell leaves the best static overall only for a clearly better one
        goodput = {p: s["goodput_tok_s"] for p, s in cell["static"].items()}
        if cell["pick"] != fallback:
            assert cell["pick"] == max(goodput, key=lambda p: goodput[p])
            assert goodput[cell["pick"]] >= 1.03 * goodput.get(fallback, 0.0)


def test_benchmark_runs_several_traces_and_reports_the_mean(tmp_path: Path) -> None:
    paths = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    traces = [trace_gen.tiny_concurrent_trace(), trace_gen.tiny_concurrent_trace(8)]
    for path, trace in zip(paths, traces, strict=True):
        write_trace(Path(path), trace)
    argv = [sys.executable, "-m", "bench.routing", "--trace", ",".join(paths), "--repeat", "2"]
    argv += ["--preset", "setup-b", "--time-scale", "200", "--json"]
    argv += ["--policies", "static:off,adaptive"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=CHECKOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert list(report["traces"]) == paths
    goodputs: list[dict[str, float]] = []
    for path, trace in zip(paths, traces, strict=True):
        one = report["traces"][path]  # what --trace with that trace alone prints
        assert (one["trace"], one["requests"], len(one["runs"])) == (path, len(trace), 2)
        assert one["mean"]["setup-b"]["runs"] == 2
        for run in one["runs"]:
            goodputs.append({p: s["goodput_tok_s"] for p, s in run["setup-b"]["policies"].items()})
            assert run["setup-b"]["policies"]["adaptive"]["requests"] == len(trace)
    mean = report["mean"]["setup-b"]
    assert mean["runs"] == 4
    expected = {p: sum(g[p] for g in goodputs) / 4 for p in ("static:off", "adaptive")}
    assert mean["goodput_tok_s"] == pytest.approx(expected)
    assert mean["ratios"] == ratios({p: {"goodput_tok_s": g} for p, g in expected.items()})

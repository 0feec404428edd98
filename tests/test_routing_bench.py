"""The routing benchmark: trace format, deterministic traces, and a smoke run of the real thing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import trace_gen
from bench.routing_report import ratios
from bench.routing_trace import (
    PATHS,
    TraceError,
    dump_lines,
    parse_line,
    read_trace,
    sessions_of,
    write_trace,
)

SMOKE_POLICIES = ("static:off", "static:max", "rules", "adaptive", "oracle")
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
}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "expected an object"),
        ('{"at": -1, "session": null, "path": "/v1/completions", "body": {}}', "'at'"),
        ('{"at": 0, "session": 3, "path": "/v1/completions", "body": {}}', "'session'"),
        ('{"at": 0, "session": null, "path": "/v1/embeddings", "body": {}}', "'path'"),
        ('{"at": 0, "session": null, "path": "/v1/completions", "body": []}', "'body'"),
    ],
)
def test_trace_lines_are_validated(line: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_line(4, line)
    with pytest.raises(TraceError, match="line 5"):
        parse_line(4, line)


def test_traces_round_trip_and_use_every_api(tmp_path: Path) -> None:
    trace = trace_gen.tiny_trace()
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    assert read_trace(path) == trace
    assert {r.path for r in trace} == set(PATHS)
    assert all(r.body["model"] == "mtp-demo" for r in trace)
    # only what clients send: no session or profile hints for the proxy in the bodies
    assert not any("X-MTP" in json.dumps(r.body) for r in trace)


def test_default_trace_is_the_generators_output_for_its_seed() -> None:
    generated = trace_gen.default_trace()
    assert generated == trace_gen.default_trace()  # seeded: the same every time
    bundled = trace_gen.DEFAULT_TRACE.read_text(encoding="utf-8")
    assert bundled == "".join(dump_lines(generated))
    assert len(bundled.encode()) < 5_000_000
    sessions = {r.session for r in generated if r.session}
    assert sum(1 for s in sessions if s.startswith("agent")) >= 3
    assert {r.path for r in generated} == set(PATHS)


def test_shift_trace_turns_from_prose_to_code() -> None:
    trace = trace_gen.shift_trace()
    shifted = trace_gen.shifted_requests(trace)
    assert 0 < len(shifted) < len(trace)
    assert min(trace[i].at for i in shifted) >= trace_gen.SHIFT_AT
    for session, requests in sessions_of(trace).items():
        if session is not None:  # a session is code (shifted) or prose as a whole
            assert len({r.index in shifted for r in requests}) == 1
            assert (requests[0].index in shifted) == (requests[0].at >= trace_gen.SHIFT_AT)


def test_ratios() -> None:
    def s(goodput: float) -> dict[str, float]:
        return {"goodput_tok_s": goodput}

    r = ratios(
        {
            "static:off": s(20.0),
            "static:max": s(30.0),
            "rules": s(27.0),
            "adaptive": s(33.0),
            "oracle": s(34.0),
        }
    )
    assert r["best_static"] == "static:max"
    assert r["adaptive_vs_oracle"] == pytest.approx(33 / 34, abs=1e-4)
    assert r["adaptive_vs_best_static"] == pytest.approx(1.1)
    assert r["rules_vs_best_static"] == pytest.approx(0.9)
    assert r["gain_captured"] == pytest.approx(0.75)


def test_benchmark_smoke_run(tmp_path: Path) -> None:
    path = tmp_path / "tiny.jsonl"
    write_trace(path, trace_gen.tiny_trace())
    argv = [sys.executable, "-m", "bench.routing", "--trace", str(path), "--preset", "setup-b"]
    argv += ["--time-scale", "200", "--json", "--policies", ",".join(SMOKE_POLICIES)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["requests"] == len(trace_gen.tiny_trace())
    entry = report["runs"][0]["setup-b"]
    policies = entry["policies"]
    assert set(policies) == set(SMOKE_POLICIES)
    for summary in policies.values():
        assert set(summary) == SUMMARY_KEYS
        assert (summary["requests"], summary["errors"]) == (report["requests"], 0)
        assert summary["goodput_tok_s"] > 0 and summary["latency_p95_s"] > 0
    assert policies["static:off"]["mix"] == {"off": report["requests"]}
    assert set(entry["ratios"]) >= {
        "best_static",
        "adaptive_vs_oracle",
        "adaptive_vs_best_static",
        "rules_vs_best_static",
    }
    goodput = {name: s["goodput_tok_s"] for name, s in policies.items()}
    statics = [goodput["static:off"], goodput["static:max"]]
    # One request at a time: the oracle, which knows each backend's cache and speed, beats the
    # worse static setting and matches the better one (within sampling noise).
    assert goodput["oracle"] > min(statics)
    assert goodput["oracle"] >= 0.95 * max(statics)

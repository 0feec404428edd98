"""bench/context_decline.py against a real simulator process: the prompts reach the contexts
asked for (its characters per token are the simulator's), and what it measures declines with the
context as the preset's model does."""

from __future__ import annotations

import asyncio

import pytest

from bench import context_decline
from bench.processes import start_simulator


def test_the_prompts_reach_the_context_and_the_ratio_declines() -> None:
    server = start_simulator(context_decline.simulator_args("setup-a", 2, time_scale=40, seed=1))
    try:
        rows = asyncio.run(context_decline.measure(server.url, [2], [0, 24], tokens=64))
    finally:
        server.stop()
    short, long = rows
    assert short.context < 200
    assert long.context == pytest.approx(24_000, rel=0.1)
    for kind in ("code", "prose"):
        # setup-a: depth 3 gains on short prompts and loses at 24k with two decoding (its model
        # gives ~1.2-1.35x and ~0.8-0.9x; a session's latent acceptance moves each by ~10 %).
        assert short.ratios[kind] > 1.05
        assert long.ratios[kind] < short.ratios[kind] * 0.9


def test_the_report_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--preset", "setup-b", "--contexts", "0,2", "--loads", "2", "--tokens", "32"]
    assert context_decline.main([*argv, "--time-scale", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("preset setup-b:")
    rows = [line.split() for line in lines[3:]]
    assert [r[:1] for r in rows] == [["2"], ["2"]]
    assert all(len(r) == 6 and all(float(x) > 0 for x in r[2:]) for r in rows)
    assert rows[0][2] == rows[0][3]  # the first row is what the carry starts from

"""bench/spec_depths.py, bounded, on the real patched llama-server and Gemma 3 270M: every class
is asked at every depth, depth 0 drafts nothing and a deeper one drafts, and the report prints a
row per class with the ratios to depth 0."""

from __future__ import annotations

import pytest

from bench import spec_depths
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.real_models import GEMMA3_270M, real_model

pytestmark = pytest.mark.llama


def test_each_class_at_each_depth_and_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    binary, gemma = patched_llama_server_binary(), real_model(GEMMA3_270M)
    samples = spec_depths.measure(binary, gemma, "ngram-mod", [0, 4], repeats=1, tokens=24)
    assert [(s.kind, s.depth) for s in samples] == [
        (kind, depth) for kind in spec_depths.CLASSES for depth in (0, 4)
    ]
    assert all(s.tok_s > 0 for s in samples)
    assert all(s.drafted == 0 for s in samples if s.depth == 0)
    assert sum(s.drafted for s in samples if s.depth == 4) > 0  # the copy drafts, at least
    spec_depths.report(samples, [0, 4])
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[1] == "ngram-mod: median decode tok/s at depth 0, each depth / depth 0 (acceptance)"
    )
    rows = {line.split()[0]: line.split() for line in lines[3::2]}
    assert sorted(rows) == sorted(spec_depths.CLASSES)
    assert all(row[2] == "1.00" and float(row[3]) > 0 for row in rows.values())

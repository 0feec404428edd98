"""The simulator's regression floors (bench/floors.py): the verdict per row, the file's rules,
and the file agreeing with the table docs/benchmarks.md shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.floors import FLOORS, Row, load, verdict

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def test_a_row_fails_only_past_the_tolerance_below_its_floor() -> None:
    row = Row("solo", "setup-a", floor=20.0)
    assert verdict(row, 19.7, 0.02) == "ok"  # -1.5 %
    assert verdict(row, 19.5, 0.02).startswith("below: 19.50 < 19.60")


def test_a_recorded_reason_holds_the_row_to_its_accepted_figure() -> None:
    row = Row("solo", "setup-a", floor=20.0, accepted=18.0, why="traded for the real engine")
    assert verdict(row, 17.9, 0.02) == "ok"
    assert "accepted" in verdict(row, 17.0, 0.02)


def test_accepted_and_why_go_together(tmp_path: Path) -> None:
    path = tmp_path / "floors.toml"
    path.write_text(
        'tolerance = 0.02\n[[rows]]\ntrace = "solo"\npreset = "p"\nfloor = 1.0\naccepted = 0.9\n'
    )
    with pytest.raises(ValueError, match="accepted and why go together"):
        load(path)


def test_the_floors_are_the_table_the_docs_show() -> None:
    _, rows = load(FLOORS)
    section = DOCS.read_text().split("### Simulator regression floors", 1)[1].split("\n### ")[0]
    shown = {
        (kind, preset): float(goodput)
        for kind, preset, goodput in re.findall(
            r"^\| (\w+) \| ([\w-]+) \| adaptive \| ([\d.]+) \|", section, re.MULTILINE
        )
    }
    assert shown == {(row.kind, row.preset): row.floor for row in rows}

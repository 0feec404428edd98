"""The simulator's regression floors: replay each recorded trace x preset row, compare.

    python -m bench.floors [--preset P[,P...]] [--trace-kind solo|default|concurrent] [--json]

Each row of bench/floors.toml is adaptive's recorded goodput on one process, the mean over the
seeds its trace lists (``python -m bench.routing --trace T --preset P --policies adaptive``).
A row fails when its replay falls more than ``tolerance`` below its floor, unless the file
records why it may (``accepted`` and ``why``: a change that trades the simulator's figure for a
real engine's). Exit 1 when a row fails. The floors guard the simulator's figures from a change
made for another reason; they are not targets: routing is judged on a real engine first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOORS = Path(__file__).with_name("floors.toml")


@dataclass(frozen=True)
class Row:
    trace: str
    preset: str
    floor: float
    accepted: float | None = None
    why: str | None = None

    @property
    def kind(self) -> str:
        return self.trace.split(",")[0].split(":")[0]

    def bound(self, tolerance: float) -> float:
        """The least goodput that passes: below the floor by the tolerance, or the accepted
        figure where a change recorded why it may be lower."""
        held = self.accepted if self.accepted is not None else self.floor
        return held * (1.0 - tolerance)


def load(path: Path = FLOORS) -> tuple[float, list[Row]]:
    data = tomllib.loads(path.read_text())
    rows = [Row(**row) for row in data["rows"]]
    for row in rows:
        if (row.accepted is None) != (row.why is None):
            raise ValueError(f"{row.trace} x {row.preset}: accepted and why go together")
    return float(data["tolerance"]), rows


def verdict(row: Row, goodput: float, tolerance: float) -> str:
    """'ok', or what failed, in words."""
    if goodput >= row.bound(tolerance):
        return "ok"
    held = "accepted" if row.accepted is not None else "floor"
    return f"below: {goodput:.2f} < {row.bound(tolerance):.2f} ({held} less {tolerance:.0%})"


def replay(row: Row) -> float:
    """Adaptive's mean goodput over the row's traces, from bench.routing's JSON."""
    argv = [sys.executable, "-m", "bench.routing", "--preset", row.preset, "--trace", row.trace]
    argv += ["--policies", "adaptive", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    mean = report.get("mean") or _single(report)
    return float(mean[row.preset]["goodput_tok_s"]["adaptive"])


def _single(report: dict[str, Any]) -> dict[str, Any]:
    """One trace's report as a mean of one run."""
    run: dict[str, Any] = report["runs"][0]
    return {
        preset: {"goodput_tok_s": {p: v["goodput_tok_s"] for p, v in r["policies"].items()}}
        for preset, r in run.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", help="only these presets (comma-separated)")
    parser.add_argument("--trace-kind", choices=("solo", "default", "concurrent"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    tolerance, rows = load()
    presets = set(args.preset.split(",")) if args.preset else None
    chosen = [
        r
        for r in rows
        if (presets is None or r.preset in presets) and args.trace_kind in (None, r.kind)
    ]
    results = []
    for row in chosen:
        goodput = replay(row)
        results.append(
            {
                "trace": row.trace,
                "preset": row.preset,
                "floor": row.floor,
                "goodput": round(goodput, 2),
                "verdict": verdict(row, goodput, tolerance),
            }
        )
        if not args.json:
            last = results[-1]
            print(
                f"{row.kind:10} {row.preset:16} floor {row.floor:6.2f}  now {goodput:6.2f}  "
                f"{goodput / row.floor:5.3f}x  {last['verdict']}",
                flush=True,
            )
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if any(r["verdict"] != "ok" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The per-client, per-template table of a run of the client tests.

    MTP_CLIENT_RUNS=runs.jsonl MTP_CLIENT_TEMPLATES=Qwen3.5-4B,google-gemma-4-31B-it \\
        .venv/bin/pytest tests/clients -m clients
    python -m bench.client_table runs.jsonl

Each line of the file is one client run written by tests/clients (test, target, exit code, the
proxy's method/path/status for every request of the session). The table has one row per test
(its parameters other than the target kept) and one column per target: "exit 0, 2 x 200" or
"exit 1, 11 x 500".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def _row_name(test: str, target: str) -> str:
    """`...::test_opencode_run[llama-server-Qwen3.5-4B-anthropic]` -> `opencode_run[anthropic]`."""
    name = test.rsplit("::", maxsplit=1)[-1].removeprefix("test_")
    base, _, params = name.partition("[")
    rest = [p for p in params.rstrip("]").replace(target, "").split("-") if p]
    return f"{base}[{'-'.join(rest)}]" if rest else base


def _cell(run: dict[str, Any]) -> str:
    statuses = Counter(status for _, _, status in run["requests"] if status is not None)
    shown = ", ".join(f"{n} x {status}" for status, n in sorted(statuses.items()))
    return f"exit {run['exit']}, {shown or 'no request'}"


def table(runs: list[dict[str, Any]]) -> str:
    targets: list[str] = []
    cells: dict[str, dict[str, list[str]]] = {}
    for run in runs:
        target = run["target"]
        if target not in targets:
            targets.append(target)
        row = _row_name(run["test"], target)
        cells.setdefault(row, {}).setdefault(target, []).append(_cell(run))
    lines = ["| client run | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for row, by_target in cells.items():
        shown = ["; ".join(by_target.get(target, ["-"])) for target in targets]
        lines.append(f"| {row} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_table", description=__doc__)
    parser.add_argument("runs", type=Path, help="the MTP_CLIENT_RUNS file of a test run")
    args = parser.parse_args(argv)
    runs = [json.loads(line) for line in args.runs.read_text().splitlines() if line.strip()]
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

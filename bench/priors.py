"""Priors from another box: requests until a new proxy makes the choices a trained one makes.

Box A (a proxy over simulated backends off/min/max, setup-b) serves a stream of requests of two
classes (code and prose, ~3k characters) until its choice per class settles; its learned file is
exported (`mtp-proxy learned export`). Then, side by side in one run on the same sequence: box B
starts from A's export (`mtp-proxy learned import`) and box C starts cold. For each, the count
is the requests sent until every class got A's choice `--streak` times in a row. Last, the
import's merge is timed on `--exports` copies of A's export (parse and sum, as the import runs
it), and so is the merge of full-table exports (120 cells: the default settings' whole table)
from 10, 100 and 1,000 boxes, for the scaling arithmetic of docs/operations.md.

    python -m bench.priors [--requests 80] [--exports 1000] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import tomli_w

from bench.processes import ProxyProcess, running_proxy
from proxy.routing.priors import SUMS, LearnedKey, merge, read_export
from proxy.workloads.texts import code_file, prose

MODEL = "mtp-demo"
ADMIN = "bench-admin"
PROFILES = ("off", "min", "max")


def config(workdir: Path, box: str) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 0.5},
        "routing": {
            "clock_scale": 50.0,
            "seed": 7,
            "learned_file": str(workdir / "learned.json"),
            "box_id": box,
        },
        "models": [
            {
                "name": MODEL,
                "backend": "simulator",
                "args": ["--preset", "setup-b", "--time-scale", "50", "-np", "4", "-c", "131072"],
                "profiles": [
                    {"name": "off"},
                    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2},
                    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
                ],
            }
        ],
    }


def workload(count: int) -> list[tuple[str, str]]:
    """(class, prompt), the two classes alternating, the same for every box."""
    rng = random.Random(11)
    out = []
    for n in range(count):
        kind = "code" if n % 2 == 0 else "prose"
        text = code_file(rng, 3000) if kind == "code" else prose(rng, 3000)
        ask = "Refactor this file." if kind == "code" else "Summarise this text."
        out.append((kind, f"{ask}\n\n{text}"))
    return out


def ask(proxy: ProxyProcess, prompt: str) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        return str(response.headers["X-MTP-Profile"])


def wait_ready(proxy: ProxyProcess) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, body = proxy.get_json("/admin/backends", admin_key=ADMIN)
        if status == 200 and all(b["state"] == "ready" for b in body["backends"]):
            return
        time.sleep(0.1)
    raise TimeoutError("backends not ready")


def serve(workdir: Path, box: str, load: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(class, profile chosen) of every request of ``load`` on a proxy of box ``box``."""
    with running_proxy(config(workdir, box), workdir / "proxy") as proxy:
        wait_ready(proxy)
        return [(kind, ask(proxy, prompt)) for kind, prompt in load]


def settled(picks: list[tuple[str, str]], tail: int = 12) -> dict[str, str]:
    """A's choice per class: the profile it picked most over its last ``tail`` of the class."""
    by_class: dict[str, list[str]] = {}
    for kind, profile in picks:
        by_class.setdefault(kind, []).append(profile)
    return {k: Counter(v[-tail:]).most_common(1)[0][0] for k, v in by_class.items()}


def requests_to_reach(picks: list[tuple[str, str]], target: dict[str, str], streak: int) -> int:
    """Requests sent until every class got its target ``streak`` times in a row (the request
    that completed the last streak counted); len + 1 when not within the run."""
    runs = dict.fromkeys(target, 0)
    done: dict[str, bool] = dict.fromkeys(target, False)
    for n, (kind, profile) in enumerate(picks, start=1):
        runs[kind] = runs[kind] + 1 if profile == target[kind] else 0
        done[kind] = done[kind] or runs[kind] >= streak
        if all(done.values()):
            return n
    return len(picks) + 1


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "proxy.cli", *args], check=True, capture_output=True)


def merge_seconds(export: Path, copies: int) -> tuple[float, int]:
    """Median of 3 merges of ``copies`` exports (each parsed and checked, then summed), and the
    merged document's size in bytes."""
    raw = export.read_bytes()
    document = read_export(raw, "a")
    key = LearnedKey.from_json(document["keys"][MODEL])
    times, size = [], 0
    for _ in range(3):
        started = time.perf_counter()
        parsed = [(f"box-{n}", read_export(raw, f"box-{n}")) for n in range(copies)]
        merged = merge(parsed, {MODEL: key})
        times.append(time.perf_counter() - started)
        size = len(json.dumps(merged, separators=(",", ":")))
    return statistics.median(times), size


def full_table(raw_key: dict[str, str]) -> bytes:
    """An export of a full table under the default settings: 5 context buckets x 2 kinds x 4
    load levels (the pool's and 1, 2, 4) x 3 profiles = 120 cells (A's holds only the cells
    its traffic reached)."""
    buckets = ["<4k", "4k-16k", "16k-32k", "32k-64k", ">64k"]
    sums = {name: [12.5, 456.25, 8901.5, 40.0] for name in SUMS}
    rows = [
        {"model": MODEL, "bucket": b, "kind": k, "level": lv, "profile": p, **sums}
        for b, k, lv, p in itertools.product(buckets, ("code", "prose"), (0, 1, 2, 4), PROFILES)
    ]
    document = {
        "format": "mtp-proxy-learned-export",
        "version": 1,
        "boxes": 1,
        "keys": {MODEL: raw_key},
        "cells": rows,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def fleet_merges(export: Path, sizes: tuple[int, ...]) -> list[dict[str, float]]:
    """For each fleet size: one full-table export's bytes, the merge's seconds (one run), the
    merged bytes."""
    key = json.loads(export.read_bytes())["keys"][MODEL]
    raw = full_table(key)
    out = []
    for boxes in sizes:
        started = time.perf_counter()
        parsed = [(f"box-{n}", read_export(raw, f"box-{n}")) for n in range(boxes)]
        merged = merge(parsed, {MODEL: LearnedKey.from_json(key)})
        seconds = time.perf_counter() - started
        size = len(json.dumps(merged, separators=(",", ":")))
        out.append(
            {"boxes": boxes, "export_bytes": len(raw), "merge_s": seconds, "merged_bytes": size}
        )
    return out


def run(requests: int, exports: int, streak: int) -> dict[str, Any]:
    load = workload(requests)
    with tempfile.TemporaryDirectory(prefix="bench-priors-") as tmp:
        root = Path(tmp)
        first = serve(root / "a", "box-a", workload(max(requests, 60)))
        target = settled(first)
        export = root / "a-export.json"
        cli("learned", "export", str(export), "--config", str(root / "a/proxy/config.toml"))
        (root / "b").mkdir()
        (root / "b/cli.toml").write_text(tomli_w.dumps(config(root / "b", "box-b")))
        cli("learned", "import", str(export), "--config", str(root / "b/cli.toml"))
        primed = serve(root / "b", "box-b", load)
        cold = serve(root / "c", "box-c", load)
        seconds, merged_bytes = merge_seconds(export, exports)
        fleet = fleet_merges(export, tuple(n for n in (10, 100, 1000) if n <= exports))
        return {
            "target": target,
            "requests": requests,
            "streak": streak,
            "from_priors": requests_to_reach(primed, target, streak),
            "cold": requests_to_reach(cold, target, streak),
            "export_bytes": export.stat().st_size,
            "exports": exports,
            "merge_s": seconds,
            "merged_bytes": merged_bytes,
            "fleet": fleet,
        }


def render(result: dict[str, Any]) -> str:
    never = result["requests"] + 1
    words = {n: (str(n) if n < never else f"> {result['requests']}") for n in range(never + 1)}
    cold, primed = result["cold"], result["from_priors"]
    lines = [
        f"A's choices per class: {result['target']} (each {result['streak']} times in a row)",
        "| box | requests to A's choices |",
        "|---|---|",
        f"| cold | {words[cold]} |",
        f"| from A's export | {words[primed]} |",
        f"cold / from priors: {cold / primed:.1f}x",
        f"export: {result['export_bytes']} bytes; merge of {result['exports']} exports "
        f"(parse, check, sum): {result['merge_s']:.2f} s; merged: {result['merged_bytes']} bytes",
        "| boxes | full-table export | merge of all | merged |",
        "|---|---|---|---|",
    ]
    for row in result["fleet"]:
        lines.append(
            f"| {row['boxes']:,} | {row['export_bytes'] / 1024:.0f} KiB | {row['merge_s']:.2f} s "
            f"| {row['merged_bytes'] / 1024:.0f} KiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.priors", description=__doc__)
    parser.add_argument("--requests", type=int, default=80, help="requests per new box")
    parser.add_argument("--exports", type=int, default=1000, help="exports merged, timed")
    parser.add_argument("--streak", type=int, default=3, help="A's choice so many in a row")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run(args.requests, args.exports, args.streak)
    print(json.dumps(result) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

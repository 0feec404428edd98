"""Bodies of tiny items: /health's latency and the proxy's memory while clients send them.

`--clients` clients (threads of another process: bench.abuse's client loop) each send keyed
chats of `--mib` MiB that are nearly all empty messages (`{"messages": [{}, {}, ...]}`: 11
million objects in 32 MiB), back to back, so that as many such bodies are in flight. Meanwhile
this process asks GET /health, one request after another on a fresh connection, for
`--seconds`, and reads the proxy's peak memory (VmHWM, /proc). It prints /health's p50, p99
and worst, quiet and under the flood, the proxy's peak RSS against the bytes in flight, and
what the bodies got. Before the item caps the proxy parsed, walked and mended each on its event
loop: /health waited 10 s, and the process grew ~1 GB a body.

    python -m bench.abuse_items [--clients 4] [--mib 32] [--seconds 20] [--baseline CHECKOUT]
                                [--json]

`--baseline CHECKOUT` runs the same on that checkout's proxy first (a clone of an older main),
then on this one. Loopback only, bounded in time (`--seconds` per side) and in count.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.abuse import KEY, items_flood, known_server_settings
from bench.processes import ProxyProcess, ended_by_signals, start_proxy

_QUIET_PROBES = 100


def health_latencies(proxy: ProxyProcess, seconds: float, least: int = 0) -> dict[str, Any]:
    """GET /health one after another for `seconds` (and at least `least` times): p50, p99,
    worst (ms) and how many were not 200."""
    took: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or len(took) < least:
        began = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
        try:
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            errors += response.status != 200
        except OSError:
            errors += 1
        finally:
            connection.close()
        took.append(time.perf_counter() - began)
    took.sort()
    return {
        "p50_ms": round(statistics.median(took) * 1e3, 1),
        "p99_ms": round(took[min(len(took) - 1, int(len(took) * 0.99))] * 1e3, 1),
        "worst_ms": round(took[-1] * 1e3, 1),
        "probes": len(took),
        "errors": errors,
    }


def memory_mib(proxy: ProxyProcess, field: str) -> float:
    """VmRSS (now) or VmHWM (the peak) of the proxy's process, in MiB."""
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} in /proc (Linux only)")


def run(proxy: ProxyProcess, args: argparse.Namespace) -> dict[str, Any]:
    quiet = health_latencies(proxy, 0.0, least=_QUIET_PROBES)
    rss_before = memory_mib(proxy, "VmRSS")
    size = args.mib << 20
    with items_flood(proxy.url, KEY, args.clients, size) as answers:
        time.sleep(1.0)  # the clients' process starts and their bodies are on the way
        flood = health_latencies(proxy, args.seconds)
    in_flight_mib = args.clients * args.mib
    peak = memory_mib(proxy, "VmHWM")
    return {
        "health_quiet": quiet,
        "health_flood": flood,
        "p99_ratio": round(flood["p99_ms"] / quiet["p99_ms"], 1),
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        "in_flight_mib": in_flight_mib,
        "peak_over_in_flight": round(peak / in_flight_mib, 2),
        "body_answers": {str(k): v for k, v in sorted(dict(answers).items())},
    }


def config(known: set[str]) -> dict[str, Any]:
    """A keyed proxy of one simulated model (a refused body never reaches it); the size limit
    the bodies are made to fit (32 MiB, the default)."""
    server = {"host": "127.0.0.1", "port": 0, "api_keys": [KEY], "max_body_bytes": 32 << 20}
    sim_args = ["--preset", "setup-b", "--time-scale", "20", "-np", "4"]
    return {
        "server": {k: v for k, v in server.items() if k in known},
        "log": {"level": "info", "format": "json"},
        "models": [
            {
                "name": "mtp-demo",
                "backend": "simulator",
                "draft_control": "per-request",
                "args": sim_args,
                "profiles": [{"name": "off"}, {"name": "max", "spec_type": "draft-mtp"}],
            }
        ],
    }


def _print(sides: dict[str, dict[str, Any]]) -> None:
    head = f"{'side':<7} {'/health p50':>11} {'p99':>8} {'worst':>8} {'p99 quiet':>9}"
    print(head + f" {'peak RSS':>9} {'in flight':>9} {'ratio':>6}  bodies answered")
    for side, r in sides.items():
        flood, quiet = r["health_flood"], r["health_quiet"]
        print(
            f"{side:<7} {flood['p50_ms']:>9.1f}ms {flood['p99_ms']:>6.1f}ms "
            f"{flood['worst_ms']:>6.1f}ms {quiet['p99_ms']:>7.1f}ms "
            f"{r['peak_rss_mib']:>6.0f}MiB {r['in_flight_mib']:>6}MiB "
            f"{r['peak_over_in_flight']:>5.2f}x  {r['body_answers']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=4, help="bodies in flight at once")
    parser.add_argument("--mib", type=int, default=32, help="each body's size")
    parser.add_argument("--seconds", type=float, default=20.0, help="/health probed so long")
    parser.add_argument("--baseline", type=Path, help="another checkout, run first (before)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    checkouts: dict[str, Path | None] = {"after": None}
    if args.baseline is not None:
        checkouts = {"before": args.baseline.resolve(), **checkouts}
    sides: dict[str, dict[str, Any]] = {}
    with ended_by_signals(), tempfile.TemporaryDirectory(prefix="bench-items-") as workdir:
        for side, checkout in checkouts.items():
            conf = config(known_server_settings(checkout))
            proxy = start_proxy(conf, Path(workdir) / side, checkout=checkout)
            try:
                sides[side] = run(proxy, args)
            finally:
                proxy.stop()
    if args.json:
        print(json.dumps(sides, indent=2))
    else:
        _print(sides)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

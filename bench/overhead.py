"""Proxy overhead: the same streaming load sent directly to a simulator and through mtp-proxy.

Both paths hit the very same simulator process (the proxy treats it as a remote backend), in
alternating rounds, so machine noise falls on both alike. Prints per-request added latency
(p50/p99 of proxied minus direct), time-to-first-chunk, and the ratio of chunks/s.

    python -m bench.overhead [--concurrency 1,64] [--requests 200] [--tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import ProxyProcess, start_proxy, start_simulator

CHAT = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


@dataclass
class Sample:
    latency_s: float
    ttfb_s: float
    chunks: int
    gaps_s: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    samples: list[Sample]
    wall_s: float
    errors: int

    @property
    def chunks_per_s(self) -> float:
        return sum(s.chunks for s in self.samples) / self.wall_s


async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int) -> Sample:
    body = {"model": "mtp-demo", "messages": CHAT, "max_tokens": tokens, "stream": True}
    started = time.perf_counter()
    first = last = 0.0
    chunks = 0
    gaps: list[float] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for _chunk in response.content.iter_any():
            now = time.perf_counter()
            if chunks == 0:
                first = now
            else:
                gaps.append(now - last)
            last = now
            chunks += 1
    return Sample(time.perf_counter() - started, first - started, chunks, gaps)


async def run_load(url: str, concurrency: int, requests: int, tokens: int) -> RunResult:
    connector = aiohttp.TCPConnector(limit=0)
    queue = iter(range(requests))
    samples: list[Sample] = []
    errors = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        for _ in queue:
            try:
                samples.append(await one_stream(session, url, tokens))
            except (aiohttp.ClientError, TimeoutError):
                errors += 1

    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return RunResult(samples, wall, errors)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(direct: RunResult, proxied: RunResult) -> dict[str, float]:
    def pct(run: RunResult, q: float, attr: str) -> float:
        return percentile([getattr(s, attr) for s in run.samples], q)

    gaps_direct = [g for s in direct.samples for g in s.gaps_s]
    gaps_proxied = [g for s in proxied.samples for g in s.gaps_s]
    return {
        "added_latency_p50_ms": 1000
        * (pct(proxied, 0.5, "latency_s") - pct(direct, 0.5, "latency_s")),
        "added_latency_p99_ms": 1000
        * (pct(proxied, 0.99, "latency_s") - pct(direct, 0.99, "latency_s")),
        "added_ttfb_p50_ms": 1000 * (pct(proxied, 0.5, "ttfb_s") - pct(direct, 0.5, "ttfb_s")),
        "added_gap_p99_ms": 1000 * (percentile(gaps_proxied, 0.99) - percentile(gaps_direct, 0.99)),
        "chunks_per_s_ratio": proxied.chunks_per_s / direct.chunks_per_s,
        "direct_latency_p50_ms": 1000 * pct(direct, 0.5, "latency_s"),
        "errors": float(direct.errors + proxied.errors),
    }


async def measure(
    direct_url: str, proxy_url: str, concurrency: int, requests: int, tokens: int, rounds: int
) -> dict[str, float]:
    direct = RunResult([], 0.0, 0)
    proxied = RunResult([], 0.0, 0)
    await run_load(direct_url, concurrency, concurrency, tokens)  # warm both paths' pools
    await run_load(proxy_url, concurrency, concurrency, tokens)
    for _ in range(rounds):
        for target, url in ((direct, direct_url), (proxied, proxy_url)):
            result = await run_load(url, concurrency, requests // rounds, tokens)
            target.samples += result.samples
            target.wall_s += result.wall_s
            target.errors += result.errors
    return compare(direct, proxied)


def proxy_config(backend_url: str) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"level": "info", "format": "json"},  # as deployed: one line per request
        "models": [
            {
                "name": "mtp-demo",
                "backend": "simulator",
                "profiles": [{"name": "off", "url": backend_url}],
            }
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,64", help="comma-separated stream counts")
    parser.add_argument("--requests", type=int, default=256, help="requests per path and level")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per streamed answer")
    parser.add_argument("--rounds", type=int, default=4, help="alternations direct/proxy")
    parser.add_argument("--tok-s", type=float, default=100.0, help="pace of each stream")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    # The "fast" preset decodes ~2,400 tok/s; the time scale slows it to a GPU-like pace.
    scale = args.tok_s / 2400.0
    simulator = start_simulator(["--preset", "fast", "--time-scale", str(scale), "-np", "512"])
    with tempfile.TemporaryDirectory() as workdir:
        proxy: ProxyProcess | None = None
        try:
            proxy = start_proxy(proxy_config(simulator.url), Path(workdir))
            results = {
                level: asyncio.run(
                    measure(
                        simulator.url,
                        proxy.url,
                        level,
                        max(args.requests, level),
                        args.tokens,
                        args.rounds,
                    )
                )
                for level in levels
            }
        finally:
            if proxy is not None:
                proxy.stop()
            simulator.stop()
    report(results, args.json)
    return 0


def report(results: dict[int, dict[str, float]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({str(k): v for k, v in results.items()}, indent=2))
        return
    columns = ("streams", "added p50", "added p99", "ttfb +p50", "gap +p99", "chunks/s", "errors")
    print("  ".join(f"{c:>9}" for c in columns))
    for level, r in results.items():
        cells = [f"{level}"]
        cells += [f"{r[k]:.2f}ms" for k in ("added_latency_p50_ms", "added_latency_p99_ms")]
        cells += [f"{r[k]:.2f}ms" for k in ("added_ttfb_p50_ms", "added_gap_p99_ms")]
        cells += [f"{r['chunks_per_s_ratio']:.3f}", f"{int(r['errors'])}"]
        print("  ".join(f"{c:>9}" for c in cells))
    print("(added = through the proxy minus direct, same simulator, alternating rounds)")


if __name__ == "__main__":
    raise SystemExit(main())

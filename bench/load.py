"""Load: many concurrent paced streams through the proxy, for a fixed time, loopback only.

The simulated backends have more slots than there are streams and decode at a fixed pace that
does not slow down with batch size, so the proxy (not the backends) is what is under test. Each
stream lasts `--stream-s` seconds and is re-opened until `--duration` is over, so connections
churn as in real traffic. Prints errors, streams and events, and the proxy's file descriptors,
sockets and RSS before, during (peak) and after the load.

    python -m bench.load [--streams 1000] [--duration 60] [--tok-s 5] [--stream-s 10] [--json]

Bounded in count and time: at most `--streams` connections, at most `--duration` + one stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.processes import ProxyProcess, start_proxy

CHAT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
MODEL = "mtp-demo"

# The bundled "fast" preset with a flat pace: one token per step (no drafting), `t0_ms` apart,
# and no slow-down with batch size (the backends are not what this measures).
_PACED_PRESET = """
name = "paced"
description = "flat-paced twin for proxy load tests"

[model]
name = "mtp-demo"
n_ctx = 1048576
n_ctx_train = 1048576
n_vocab = 151936
n_embd = 64
n_params = 1000000
size = 700000

[decode]
t0_ms = {t0_ms}
ctx_half = 1.0e12
batch_growth = 0.0

[spec]
step_overhead = 0.0
draft_cost = 0.0
verify_cost_per_ktok = 0.0
concurrency_growth = 0.0
spill_n_max = 0
spill_slowdown = 1.0

[acceptance]
code = 0.5
prose = 0.5
floor = 0.2
ctx_half = 181156.0
latent_sigma = 0.0
easy = 0.96
hard = 0.04
confidence_easy_min = 0.76
confidence_hard_max = 1.0
minimum = 0.02
maximum = 0.97

[prefill]
tokens_per_s = 1.0e9
ctx_half = 1.0e12
mtp_penalty = 0.0

[output]
prose_min = 100000
prose_max = 100000
code_min = 100000
code_max = 100000
"""


def paced_preset(directory: Path, tok_s: float) -> Path:
    """Write a simulator preset that decodes every stream at exactly `tok_s` tokens/s."""
    path = directory / f"paced-{tok_s:g}.toml"
    path.write_text(_PACED_PRESET.format(t0_ms=1000.0 / tok_s))
    return path


def simulator_args(preset: Path, slots: int) -> list[str]:
    return ["--preset", str(preset), "-np", str(slots), "-c", "1048576"]


def load_config(preset: Path, *, slots: int, replicas: int) -> dict[str, Any]:
    """A proxy with `replicas` simulated backends of `slots` slots each, logging as deployed."""
    return {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": "bench-admin"},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0},
        "models": [
            {
                "name": MODEL,
                "backend": "simulator",
                "args": simulator_args(preset, slots),
                "profiles": [{"name": "off", "replicas": replicas}],
            }
        ],
    }


# --- what the proxy process holds (Linux /proc) ------------------------------------------------


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def socket_count(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed between listdir and readlink
    return count


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/<pid>/stat fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessSample:
    fds: int
    sockets: int
    rss_mb: float

    @classmethod
    def of(cls, pid: int) -> ProcessSample:
        return cls(fd_count(pid), socket_count(pid), rss_mb(pid))


# --- the load ----------------------------------------------------------------------------------


@dataclass
class LoadResult:
    streams: int
    duration_s: float
    started: int = 0
    completed: int = 0
    events: int = 0  # SSE data events received (reads may carry several)
    errors: list[str] = field(default_factory=list)
    peak: ProcessSample | None = None
    wall_s: float = 0.0


_EVENT = b"data: "


async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int) -> int:
    """One stream to its end; returns its SSE data events (one per token, then [DONE]); raises
    ValueError if it did not end well."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": tokens, "stream": True}
    body["ignore_eos"] = True
    events = 0
    tail = b""
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise ValueError(f"status {response.status}: {(await response.read())[:200]!r}")
        async for chunk in response.content.iter_any():
            # A read may carry several events, or split one: count in the previous read's last
            # bytes plus this one, too short to hold a whole marker counted before.
            window = tail[-(len(_EVENT) - 1) :] + chunk
            events += window.count(_EVENT)
            tail = (tail + chunk)[-64:]
    if not tail.rstrip().endswith(b"data: [DONE]"):
        raise ValueError(f"stream did not end with [DONE]: ...{tail!r}")
    return events


async def hold_streams(
    url: str,
    streams: int,
    duration_s: float,
    *,
    stream_s: float,
    tok_s: float,
    ramp_s: float = 1.0,
    watch_pid: int | None = None,
) -> LoadResult:
    """`streams` concurrent streams, each re-opened when it ends, until `duration_s` is over."""
    result = LoadResult(streams, duration_s)
    tokens = max(1, round(stream_s * tok_s))
    timeout = aiohttp.ClientTimeout(total=stream_s * 4 + 30)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    started = time.perf_counter()
    deadline = started + duration_s

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        await asyncio.sleep(n * ramp_s / streams)  # open gradually, as clients arrive
        while time.perf_counter() < deadline:
            result.started += 1
            try:
                events = await one_stream(session, url, tokens)
                result.events += events  # after the await: no lost updates
                result.completed += 1
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                result.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        watcher = asyncio.create_task(_watch(watch_pid, result)) if watch_pid else None
        await asyncio.gather(*(client(n, session) for n in range(streams)))
        if watcher is not None:
            watcher.cancel()
    result.wall_s = time.perf_counter() - started
    return result


async def _watch(pid: int, result: LoadResult) -> None:
    while True:
        sample = ProcessSample.of(pid)
        peak = result.peak
        if peak is None:
            result.peak = sample
        else:
            peak.fds = max(peak.fds, sample.fds)
            peak.sockets = max(peak.sockets, sample.sockets)
            peak.rss_mb = max(peak.rss_mb, sample.rss_mb)
        await asyncio.sleep(0.5)


async def settle(pid: int, target_fds: int, timeout_s: float) -> ProcessSample:
    """Wait (up to `timeout_s`) for the proxy's descriptors to fall back to `target_fds`."""
    deadline = time.monotonic() + timeout_s
    sample = ProcessSample.of(pid)
    while sample.fds > target_fds and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        sample = ProcessSample.of(pid)
    return sample


async def run(args: argparse.Namespace, proxy: ProxyProcess) -> dict[str, Any]:
    pid = proxy.process.pid
    before = ProcessSample.of(pid)
    warm = await hold_streams(
        proxy.url, args.streams, 0.1, stream_s=0.5, tok_s=args.tok_s, ramp_s=0.0
    )
    warmed = ProcessSample.of(pid)  # + one pooled upstream connection per concurrent stream
    load = await hold_streams(
        proxy.url,
        args.streams,
        args.duration,
        stream_s=args.stream_s,
        tok_s=args.tok_s,
        watch_pid=pid,
    )
    after = await settle(pid, warmed.fds, 5.0)
    drained = await settle(pid, before.fds, args.drain_s)  # idle keep-alive connections expire
    return {
        "streams": args.streams,
        "duration_s": args.duration,
        "tok_s_per_stream": args.tok_s,
        "stream_s": args.stream_s,
        "wall_s": round(load.wall_s, 1),
        "streams_completed": load.completed,
        "events": load.events,
        "events_per_s": round(load.events / load.wall_s),
        "errors": len(load.errors) + len(warm.errors),
        "error_samples": (warm.errors + load.errors)[:5],
        "proxy_before": asdict(before),
        "proxy_after_warmup": asdict(warmed),
        "proxy_peak": asdict(load.peak) if load.peak else None,
        "proxy_after_load": asdict(after),
        "proxy_after_drain": asdict(drained),
        "drain_s": args.drain_s,
        "proxy_alive": proxy.process.poll() is None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--tok-s", type=float, default=5.0, help="pace of each stream")
    parser.add_argument("--stream-s", type=float, default=10.0, help="length of one stream")
    parser.add_argument("--replicas", type=int, default=2, help="simulated backends")
    parser.add_argument("--drain-s", type=float, default=40.0, help="wait for idle keep-alives")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    slots = args.streams // args.replicas + 64  # enough for every stream: the proxy is measured
    with tempfile.TemporaryDirectory() as workdir:
        preset = paced_preset(Path(workdir), args.tok_s)
        config = load_config(preset, slots=slots, replicas=args.replicas)
        proxy = start_proxy(config, Path(workdir) / "proxy")
        try:
            report = asyncio.run(run(args, proxy))
        finally:
            report_exit = proxy.stop()
    report["proxy_exit_code"] = report_exit
    print_report(report, as_json=args.json)
    return 0 if report["errors"] == 0 else 1


def print_report(report: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['streams']} streams x {report['duration_s']:g} s at "
        f"{report['tok_s_per_stream']:g} tok/s each ({report['stream_s']:g} s per stream)"
    )
    print(
        f"completed streams {report['streams_completed']}, events {report['events']} "
        f"({report['events_per_s']}/s), errors {report['errors']}"
    )
    for error in report["error_samples"]:
        print(f"  error: {error}")
    print(f"{'proxy':>18}  {'fds':>6}  {'sockets':>7}  {'RSS MB':>7}")
    for label in ("before", "after_warmup", "peak", "after_load", "after_drain"):
        sample = report[f"proxy_{label}"]
        if sample:
            print(
                f"{label:>18}  {sample['fds']:>6}  {sample['sockets']:>7}  {sample['rss_mb']:>7.1f}"
            )
    print(f"(after_drain: after up to {report['drain_s']:g} s idle, keep-alives expire)")
    print(f"proxy alive after the load: {report['proxy_alive']}, exit {report['proxy_exit_code']}")


if __name__ == "__main__":
    raise SystemExit(main())

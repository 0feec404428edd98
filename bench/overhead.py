"""Proxy overhead: one load sent directly to a simulator, through mtp-proxy, through the aiohttp
floor (bench/aiohttp_floor.py: a bare relay, what any aiohttp proxy costs) and through LiteLLM.

One simulator serves every path (each proxy treats it as a remote backend). It decodes every
request at a GPU-like `--tok-s` (100 tokens/s by default) that does not slow down with batch
size, so the proxies, not the backend, make the difference. Paths take turns, round after round,
so machine noise falls on all of them alike. For each workload (small non-stream requests of 16
tokens; streams of `--tokens`) and concurrency it prints, per proxy, relative to direct:

  n                 requests measured per path (a p99 of a few dozen is close to their max)
  added p50 / p99   latency percentiles of complete requests, proxied minus direct
  ratio             delivered tokens/s of a stream, first chunk to last (streams), or
                    requests/s (non-stream), proxied / direct
  gap +p99          p99 of the delay between chunks, proxied minus direct (streams)
  CPU s/1k          the proxy process's CPU seconds (/proc/<pid>/stat) per 1,000 requests

then LiteLLM's added latency as a multiple of mtp-proxy's, what mtp-proxy adds above the floor,
and the largest number of paced streams mtp-proxy sustains at >= 0.98 x direct tokens/s
(streams of --search-s seconds).

    python -m bench.overhead [--levels 1,64,256] [--tok-s 100] [--no-litellm] [--no-floor]
                             [--baseline DIR] [--live-page] [--json]

``--baseline DIR`` adds mtp-proxy as found in another checkout (`git worktree add DIR REV`):
a change's before and after, measured in the same run. ``--live-page`` adds a second mtp-proxy
of this checkout, ``mtp-proxy+page``, which one open live page (/ui/) reads all along: what a
busy proxy pays for the page is that path against ``mtp-proxy``. ``p50 rounds`` is the range of
the added p50 over the rounds, the noise to hold any difference against.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp

from bench.aiohttp_floor import start_floor
from bench.load import cpu_seconds, paced_preset
from bench.processes import (
    ProxyProcess,
    ServerProcess,
    start_proxy,
    start_simulator,
)

CHAT = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]
SUSTAINED = 0.98
FLOOR = "aiohttp-floor"  # bench/aiohttp_floor.py: a relay and nothing else
BASELINE = "baseline"  # mtp-proxy from --baseline DIR
PAGE = "mtp-proxy+page"  # mtp-proxy of this checkout with one live page open (--live-page)


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    pid: int | None  # the proxy process whose CPU time is counted (None: direct)
    page: bool = False  # one live page reads it all along (--live-page)


@dataclass(frozen=True)
class Workload:
    stream: bool
    concurrency: int
    requests: int
    tokens: int

    @property
    def label(self) -> str:
        return "stream" if self.stream else "small"


@dataclass
class Sample:
    latency_s: float
    ttfb_s: float
    tokens: int
    gaps_s: list[float] = field(default_factory=list)

    @property
    def stream_tok_s(self) -> float:
        """The pace the client saw, first chunk to last (waiting for the first is latency)."""
        span = sum(self.gaps_s)
        return (self.tokens - 1) / span if span > 0 else float("nan")


@dataclass
class RunResult:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    cpu_s: float = 0.0
    round_p50_s: list[float] = field(default_factory=list)  # latency p50 of each round added

    def add(self, other: RunResult) -> None:
        self.round_p50_s.append(percentile([s.latency_s for s in other.samples], 0.5))
        self.samples += other.samples
        self.wall_s += other.wall_s
        self.errors += other.errors
        self.cpu_s += other.cpu_s

    @property
    def requests_per_s(self) -> float:
        return len(self.samples) / self.wall_s if self.wall_s else 0.0

    @property
    def stream_tok_s(self) -> float:
        """Delivered tokens/s of the average stream."""
        rates = [s.stream_tok_s for s in self.samples if s.gaps_s]
        return sum(rates) / len(rates) if rates else float("nan")


# --- the client --------------------------------------------------------------------------------
# A minimal HTTP/1.1 client on a bare asyncio.Protocol: it counts tokens and stamps arrivals inside
# data_received and wakes its caller once per response, not once per chunk, so the load generator
# takes as little of the 2 cores as possible away from the processes being compared.

_TOKEN = b'"content":"'
_CHUNKED_END = b"0\r\n\r\n"


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = False
        self._done: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.head = b""
        self.status = 0
        self.length: int | None = None  # Content-Length, None when chunked
        self.body = bytearray()
        self.received = 0
        self.tokens = 0
        self.tail = b""
        self.arrivals: list[float] = []
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError(f"connection lost: {exc}"))

    def send(self, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self._reset()
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self._done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.status:
            self.head += data
            head, sep, data = self.head.partition(b"\r\n\r\n")
            if not sep:
                return
            self._parse_head(head)
        self.arrivals.append(now)
        self.received += len(data)
        window = self.tail + data
        self.tokens += window.count(_TOKEN)
        self.tail = window[-16:]
        if self.length is not None:
            self.body += data
            finished = self.received >= self.length
        else:
            finished = window.endswith(_CHUNKED_END)
        if finished and self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split(b" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self.length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.keep_alive = False


def _request_bytes(target: Target, workload: Workload, headers: dict[str, str]) -> bytes:
    body = json.dumps(
        {
            "model": "paced",
            "messages": CHAT,
            "max_tokens": workload.tokens,
            "stream": workload.stream,
            "ignore_eos": True,
        }
    ).encode()
    host = target.url.removeprefix("http://")
    lines = ["POST /v1/chat/completions HTTP/1.1", f"Host: {host}"]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _connect(target: Target) -> _Connection:
    host, port = target.url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    _, connection = await loop.create_connection(_Connection, host, int(port))
    return connection


async def one_request(connection: _Connection, request: bytes, stream: bool) -> Sample:
    started = time.perf_counter()
    async with asyncio.timeout(120):  # a stuck proxy counts as an error, not a hung bench
        await connection.send(request)
    if connection.status != 200:
        raise ValueError(f"status {connection.status}")
    arrivals = connection.arrivals
    if not stream:
        tokens = int(json.loads(bytes(connection.body))["usage"]["completion_tokens"])
        return Sample(arrivals[-1] - started, arrivals[0] - started, tokens)
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    return Sample(arrivals[-1] - started, arrivals[0] - started, connection.tokens, gaps)


async def run_load(
    target: Target, workload: Workload, requests: int, headers: dict[str, str]
) -> RunResult:
    queue = iter(range(requests))
    result = RunResult()
    request = _request_bytes(target, workload, headers)

    async def worker(n: int) -> None:
        # Clients arrive over up to half a second: a thousand SYNs at once would overflow the
        # simulator's accept backlog and time the kernel's retransmits instead of the proxies.
        await asyncio.sleep(n * min(0.5, 0.002 * workload.concurrency) / workload.concurrency)
        connection: _Connection | None = None
        for _ in queue:
            try:
                if connection is None or not connection.open:
                    connection = await _connect(target)
                sample = await one_request(connection, request, workload.stream)
            except (OSError, TimeoutError, ValueError, KeyError):
                result.errors += 1
                connection = None
                continue
            result.samples.append(sample)
            if not connection.keep_alive:
                connection = None
        if connection is not None and connection.transport is not None:
            connection.transport.close()

    cpu_before = cpu_seconds(target.pid) if target.pid else 0.0
    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(workload.concurrency)))
    result.wall_s = time.perf_counter() - started
    result.cpu_s = cpu_seconds(target.pid) - cpu_before if target.pid else 0.0
    return result


async def measure(
    targets: list[Target], workload: Workload, rounds: int, headers: dict[str, str]
) -> dict[str, RunResult]:
    """Every target gets the workload in turns, `rounds` times; results per target."""
    results = {t.name: RunResult() for t in targets}
    per_round = max(workload.requests // rounds, workload.concurrency)
    pids = [t.pid for t in targets if t.pid]
    for target in targets:  # warm every path's connection pools
        await run_load(target, workload, workload.concurrency, headers)
    for _ in range(rounds):
        for target in targets:
            await quiesce(pids)
            results[target.name].add(await run_load(target, workload, per_round, headers))
    return results


async def quiesce(pids: list[int], timeout_s: float = 20.0) -> None:
    """Wait until no proxy still works off the previous turn (LiteLLM keeps at it for seconds
    after its last answer), so each path is measured on an otherwise idle machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(pid) for pid in pids)
        await asyncio.sleep(0.3)
        if sum(cpu_seconds(pid) for pid in pids) - before <= 0.01:
            return


# --- the live page -----------------------------------------------------------------------------
# A busy proxy should pay nothing measurable for an open live page. The reader
# below asks what one open page asks (proxy/ui/static/app.js, kept equal by tests/bench): its
# files once, then every POLL_MS after the previous answers the backends, the depths and the
# requests it has not seen, and every SLOW_EVERY-th poll the routing mix and the chart.

PAGE_POLL_S = 1.5  # app.js POLL_MS
PAGE_SLOW_EVERY = 3  # app.js SLOW_EVERY
PAGE_KEEP_ROWS = 300  # app.js KEEP_ROWS
PAGE_FILES = ("/ui/", "/ui/app.css", "/ui/app.js", "/ui/icon.svg")


@dataclass
class PageReader:
    url: str
    admin_key: str
    statuses: Counter[str] = field(default_factory=Counter)  # "PATH STATUS" -> answers

    async def run(self) -> None:
        """Until cancelled; every answer is counted, so a refused or missing read shows."""
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            for path in PAGE_FILES:
                await self._get(session, path)
            after = 0
            for tick in itertools.count():
                paths = ["backends", "depths", f"requests?after={after}&limit={PAGE_KEEP_ROWS}"]
                if tick % PAGE_SLOW_EVERY == 0:
                    paths += ["routing", "chart", "drafting"]
                answers = await asyncio.gather(*(self._get(session, "/admin/" + p) for p in paths))
                after = _seen(answers[2], after)
                await asyncio.sleep(PAGE_POLL_S)

    async def _get(self, session: aiohttp.ClientSession, path: str) -> Any:
        name = path.partition("?")[0]
        try:
            async with session.get(self.url + path) as response:
                body = await response.read()
                self.statuses[f"{name} {response.status}"] += 1
                if response.status == 200 and path.startswith("/admin/"):
                    return json.loads(body)
        except (aiohttp.ClientError, TimeoutError):
            self.statuses[f"{name} error"] += 1
        return None


def _seen(recent: Any, after: int) -> int:
    """The last request the page has seen, as app.js keeps it (0 again after a restart)."""
    if recent is None:
        return after
    if recent["last"] < after:
        after = 0
    return int(recent["requests"][-1]["seq"]) if recent["requests"] else after


# --- figures -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare(direct: RunResult, proxied: RunResult, stream: bool) -> dict[str, Any]:
    def pct(run: RunResult, q: float) -> float:
        return percentile([s.latency_s for s in run.samples], q)

    gaps_direct = [g for s in direct.samples for g in s.gaps_s]
    gaps_proxied = [g for s in proxied.samples for g in s.gaps_s]
    rate = "stream_tok_s" if stream else "requests_per_s"
    served = len(proxied.samples)
    rounds = [p - d for p, d in zip(proxied.round_p50_s, direct.round_p50_s, strict=True)]
    return {
        "added_p50_ms": 1000 * (pct(proxied, 0.5) - pct(direct, 0.5)),
        "added_p50_rounds_ms": [1000 * min(rounds), 1000 * max(rounds)],
        "added_p99_ms": 1000 * (pct(proxied, 0.99) - pct(direct, 0.99)),
        "ratio": getattr(proxied, rate) / getattr(direct, rate),
        "added_gap_p99_ms": (
            1000 * (percentile(gaps_proxied, 0.99) - percentile(gaps_direct, 0.99))
            if stream
            else float("nan")
        ),
        "cpu_s_per_1k": 1000 * proxied.cpu_s / served if served else float("nan"),
        "direct_p50_ms": 1000 * pct(direct, 0.5),
        "errors": float(proxied.errors + direct.errors),
        "samples": float(served),  # a p99 of 32 samples is their maximum: one hiccup
    }


async def sustained_streams(
    direct: Target,
    proxy: Target,
    levels: list[int],
    seconds: float,
    tok_s: float,
    headers: dict[str, str],
) -> list[tuple[int, float, float, float]]:
    """Tokens/s proxied/direct at each level, one wave of `level` streams; stops below 0.98."""
    found: list[tuple[int, float, float, float]] = []
    tokens = round(seconds * tok_s)
    for level in levels:
        workload = Workload(stream=True, concurrency=level, requests=level, tokens=tokens)
        results = await measure([direct, proxy], workload, 1, headers)
        direct_rate = results[direct.name].stream_tok_s
        proxied_rate = results[proxy.name].stream_tok_s
        ratio = proxied_rate / direct_rate
        found.append((level, ratio, direct_rate, proxied_rate))
        if ratio < SUSTAINED or results[proxy.name].errors:
            break
    return found


# --- processes ---------------------------------------------------------------------------------


def proxy_config(backends: dict[str, str], key: str) -> dict[str, Any]:
    # Every mtp-proxy has the admin key, so with or without a page open they differ in one thing.
    server = {"host": "127.0.0.1", "port": 0, "api_keys": [key], "admin_key": admin_key(key)}
    return {
        "server": server,
        "log": {"level": "info", "format": "json"},  # as deployed: one line per request
        "models": [
            {
                "name": name,
                "backend": "simulator",
                "slots": 4096,  # the simulators have slots to spare: measure the proxy
                "profiles": [{"name": "off", "url": url}],
            }
            for name, url in backends.items()
        ],
    }


def admin_key(key: str) -> str:
    return key.replace("sk-bench-", "sk-bench-admin-")


@dataclass
class Processes:
    simulators: list[ServerProcess] = field(default_factory=list)
    proxy: ProxyProcess | None = None
    floor: ServerProcess | None = None
    baseline: ProxyProcess | None = None
    paged: ProxyProcess | None = None
    litellm: Any = None

    def stop(self) -> None:
        if self.paged is not None:
            self.paged.stop()
        if self.baseline is not None:
            self.baseline.stop()
        if self.floor is not None:
            self.floor.stop()
        if self.litellm is not None:
            self.litellm.stop()
        if self.proxy is not None:
            self.proxy.stop()
        for simulator in self.simulators:
            simulator.stop()


def start_all(workdir: Path, args: argparse.Namespace, key: str) -> tuple[Processes, list[Target]]:
    processes = Processes()
    preset = paced_preset(workdir, args.tok_s)
    paced = start_simulator(["--preset", str(preset), "-np", "2048", "-c", "1048576"])
    processes.simulators.append(paced)
    backends = {"paced": paced.url}
    processes.proxy = start_proxy(proxy_config(backends, key), workdir / "proxy")
    proxy = processes.proxy
    targets = [Target("mtp-proxy", proxy.url, proxy.process.pid)]
    if args.live_page:  # a twin of the proxy above, apart in one thing: a page reads it
        paged = start_proxy(proxy_config(backends, key), workdir / "paged")
        processes.paged = paged
        targets.append(Target(PAGE, paged.url, paged.process.pid, page=True))
    if args.baseline is not None:  # the same proxy from another checkout, e.g. before a change
        baseline = start_proxy(
            proxy_config(backends, key), workdir / "baseline", checkout=args.baseline
        )
        processes.baseline = baseline
        targets.append(Target(BASELINE, baseline.url, baseline.process.pid))
    if args.floor:
        processes.floor = start_floor(paced.url)
        targets.append(Target(FLOOR, processes.floor.url, processes.floor.process.pid))
    if args.litellm:
        from bench.litellm_proxy import start_litellm

        processes.litellm = start_litellm(backends, workdir / "litellm", master_key=key)
        targets.append(Target("litellm", processes.litellm.url, processes.litellm.pid))
    return processes, targets


async def run_all(
    args: argparse.Namespace, targets: list[Target], backends: dict[str, str], key: str
) -> dict[str, Any]:
    readers = {t.name: PageReader(t.url, admin_key(key)) for t in targets if t.page}
    tasks = [asyncio.create_task(reader.run()) for reader in readers.values()]
    try:
        report = await measure_all(args, targets, backends, key)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    report["live_page"] = {name: dict(reader.statuses) for name, reader in readers.items()}
    return report


async def measure_all(
    args: argparse.Namespace, targets: list[Target], backends: dict[str, str], key: str
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    direct = Target("direct", backends["paced"], None)
    table: list[dict[str, Any]] = []
    for stream in (False, True):
        for level in args.levels:
            requests = max(4 * level, 32) if stream else max(16 * level, 400)
            workload = Workload(stream, level, requests, args.tokens if stream else 16)
            paths = [direct, *targets]
            print(f"measuring {workload.label} x{level} ...", file=sys.stderr, flush=True)
            results = await measure(paths, workload, args.rounds, headers)
            for target in targets:
                row = compare(results["direct"], results[target.name], stream)
                table.append(
                    {"workload": workload.label, "concurrency": level, "path": target.name, **row}
                )
    search = await sustained_streams(
        direct,
        targets[0],
        args.search,
        args.search_s,
        args.tok_s,
        headers,
    )
    return {"table": table, "sustained": search, "tok_s": args.tok_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,64,256", help="comma-separated concurrency levels")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per streamed answer")
    parser.add_argument("--rounds", type=int, default=4, help="turns of direct/proxies")
    parser.add_argument("--tok-s", type=float, default=100.0, help="pace of each stream")
    parser.add_argument("--search", default="64,128,256,384,512,768,1024", help="stream counts")
    parser.add_argument("--search-s", type=float, default=4.0, help="length of a search stream")
    parser.add_argument("--no-litellm", dest="litellm", action="store_false")
    parser.add_argument("--no-floor", dest="floor", action="store_false", help="skip the floor")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also measure mtp-proxy from this checkout (git worktree add DIR REV)",
    )
    parser.add_argument(
        "--live-page",
        action="store_true",
        help=f"also measure {PAGE}: this checkout's mtp-proxy with one live page reading it",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.levels = [int(c) for c in args.levels.split(",")]
    args.search = [int(c) for c in args.search.split(",")]
    key = "sk-bench-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as workdir:
        processes, targets = start_all(Path(workdir), args, key)
        try:
            backends = {"paced": processes.simulators[0].url}
            report = _run(run_all(args, targets, backends, key))
        finally:
            processes.stop()
    print_report(report, as_json=args.json)
    return 0


def _run(coroutine: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def _ms(value: float) -> str:
    """A delay for the table; "-" where there is none (the gap between chunks of a workload
    that does not stream)."""
    return f"{value:.2f}ms" if math.isfinite(value) else "-"


def print_report(report: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    columns = (
        "workload",
        "conc",
        "n",
        "path",
        "added p50",
        "added p99",
        "p50 rounds",
        "ratio",
        "gap +p99",
        "CPU s/1k",
        "errors",
    )
    print("  ".join(f"{c:>10}" for c in columns))
    for row in report["table"]:
        cells = [row["workload"], str(row["concurrency"]), str(int(row["samples"])), row["path"]]
        cells += [
            f"{row['added_p50_ms']:.2f}ms",
            f"{row['added_p99_ms']:.2f}ms",
            "{:.2f}..{:.2f}".format(*row["added_p50_rounds_ms"]),
            f"{row['ratio']:.3f}",
        ]
        cells += [
            _ms(row["added_gap_p99_ms"]),
            f"{row['cpu_s_per_1k']:.2f}",
            f"{int(row['errors'])}",
        ]
        print("  ".join(f"{c:>10}" for c in cells))
    mtp = {
        (r["workload"], r["concurrency"]): r for r in report["table"] if r["path"] == "mtp-proxy"
    }
    for row in (r for r in report["table"] if r["path"] == "litellm"):
        ours = mtp[(row["workload"], row["concurrency"])]
        for q in ("p50", "p99"):
            theirs, own = row[f"added_{q}_ms"], ours[f"added_{q}_ms"]
            times = theirs / own if own > 0 else float("inf")
            where = f"{row['workload']} x{row['concurrency']}"
            print(
                f"LiteLLM added {q} / mtp-proxy added {q}, {where}: {times:.1f}x "
                f"({theirs:.2f} vs {own:.2f} ms)"
            )
    rows = {(r["workload"], r["concurrency"], r["path"]): r for r in report["table"]}
    pairs = [("mtp-proxy", FLOOR), ("mtp-proxy", BASELINE), (PAGE, "mtp-proxy"), (PAGE, BASELINE)]
    for (workload, level, path), row in rows.items():
        for ours_path in (ours for ours, theirs in pairs if theirs == path):
            if (ours := rows.get((workload, level, ours_path))) is None:
                continue
            print(
                f"{ours_path} minus {path}, {workload} x{level}: "
                f"added p50 {ours['added_p50_ms'] - row['added_p50_ms']:+.2f} ms, "
                f"added p99 {ours['added_p99_ms'] - row['added_p99_ms']:+.2f} ms"
            )
    for name, statuses in report.get("live_page", {}).items():
        answers = ", ".join(f"{path} {count}" for path, count in sorted(statuses.items()))
        print(f"live page reads of {name}: {answers}")
    print(f"paced streams at {report['tok_s']:g} tok/s, mtp-proxy tokens/s as a share of direct:")
    best = 0
    for level, ratio, direct_rate, proxied_rate in report["sustained"]:
        mark = "ok" if ratio >= SUSTAINED else "below"
        print(
            f"  {level:>5} streams: {ratio:.3f} ({mark}); tok/s per stream: direct "
            f"{direct_rate:.1f}, proxied {proxied_rate:.1f} (paced at {report['tok_s']:g})"
        )
        if ratio >= SUSTAINED:
            best = level
    print(f"largest sustained at >= {SUSTAINED} x direct: {best} streams")
    print("(added = through the proxy minus direct; same simulators, paths in turns)")


if __name__ == "__main__":
    raise SystemExit(main())

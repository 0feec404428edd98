"""Load and abuse: a keyed client's chat latency, quiet and while others abuse the proxy.

One run starts the proxy (with a client key) on simulated backends and measures a keyed
client's non-stream chat, one request at a time, p50 and p99:

- quiet: nobody else;
- idle flood: `--idle` connections opened and left silent (beyond the connection cap they push
  out the idlest; within it they wait for the keep-alive timeout);
- bombs: `--bombers` threads sending unauthenticated gzip bombs (2 MB that inflate to 2 GiB),
  one every `--bomb-interval` seconds each (40 a second by default: before bodies were inflated
  in bounded steps, four bombs pushed a keyed chat from 44 ms to 8 s);
- pinned flood: `--pinned` threads sending keyed requests pinned to one profile, back to back
  (they queue like any request and get 429 past the queue; a refused one waits 0.5 s, as
  SDK clients back off, before the next);

and prints each with its ratio to quiet, so releases can be compared side by side. Then the
abuse of connections and slots (bench.abuse_slots): stalled forwarded bodies, trickled bodies,
unread streams, a restart under load, and one huge complete answer, each with what a keyed
client got meanwhile.

    python -m bench.abuse [--requests 60] [--idle 2000] [--bombers 4] [--pinned 64]
                          [--cases quiet,idle_flood,...] [--window 15] [--holders 320]
                          [--baseline CHECKOUT] [--json]

`--baseline CHECKOUT` runs every case on that checkout's proxy too (e.g. a clone of an older
main), then on this one, and prints them side by side (settings the older proxy does not know
are left out of its config).

Loopback only; bounded in count (the flags) and time (each phase: `--requests` requests, each
case of bench.abuse_slots: `--window` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import abuse_slots as slots
from bench.abusers import Attempt, abusers
from bench.processes import (
    ProxyProcess,
    ended_by_signals,
    start_proxy,
    start_server,
)

KEY = "sk-bench-abuse-0123456789"
_CHAT = {
    "model": "mtp-demo",
    "messages": [{"role": "user", "content": "Say hello to the lighthouse keeper."}],
    "max_tokens": 8,
}


@dataclass(frozen=True)
class Latency:
    p50: float
    p99: float
    errors: int
    n: int


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float = 30.0,
) -> int:
    host, port = _address(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def keyed_latencies(url: str, key: str, n: int) -> Latency:
    """n keyed chats one after another (a fresh connection each, as a CLI makes them)."""
    body = json.dumps(_CHAT).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    took, errors = [], 0
    for _ in range(n):
        began = time.perf_counter()
        try:
            status = _post(url, body, headers)
        except OSError:
            status = 0
        took.append(time.perf_counter() - began)
        errors += status != 200
    took.sort()
    return Latency(
        p50=statistics.median(took),
        p99=took[min(len(took) - 1, int(len(took) * 0.99))],
        errors=errors,
        n=n,
    )


def gzip_bomb(inflated: int, *, checksum: bool = True) -> bytes:
    """One valid gzip member of `inflated` zero bytes (2 GiB -> ~2 MB): the same 1 MiB deflate
    block repeated (a full flush makes each block independent of the ones before). Without
    `checksum` the trailer's CRC is left 0 (fast to make; only a complete inflate checks it)."""
    mib = 1 << 20
    zeros = bytes(mib)
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    count = max(inflated // mib, 1)
    crc = 0
    for _ in range(count if checksum else 0):
        crc = zlib.crc32(zeros, crc)
    last = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty final block
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return head + block * count + last + struct.pack("<II", crc, (count * mib) & 0xFFFFFFFF)


def _bomb(url: str, inflated: int, interval_s: float, key: str | None) -> Attempt:
    bomb = gzip_bomb(inflated, checksum=False)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"

    def send(_stop: Any) -> int:
        status = _post(url, bomb, headers)
        time.sleep(interval_s)
        return status

    return send


_RETRY_AFTER_429_S = 0.5  # as SDK clients do (they back off on 429), not a tight loop


def _pinned(url: str, key: str, profile: str) -> Attempt:
    body = json.dumps({**_CHAT, "max_tokens": 64}).encode()
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "X-MTP-Profile": profile,
    }

    def send(_stop: Any) -> int:
        status = _post(url, body, headers, timeout=120)
        if status == 429:
            time.sleep(_RETRY_AFTER_429_S)
        return status

    return send


def tiny_items_body(size: int) -> bytes:
    """A chat body of `size` bytes that is nearly all empty messages: `{}` three bytes each
    (32 MiB: 11 million objects)."""
    head, tail = b'{"model": "mtp-demo", "messages": [{}', b"]}"
    count = max((size - len(head) - len(tail)) // 3, 0)
    return head + b",{}" * count + tail


def _items(url: str, key: str, size: int) -> Attempt:
    body = tiny_items_body(size)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def send(_stop: Any) -> int:
        return _post(url, body, headers, timeout=300)

    return send


def bomb_flood(
    url: str,
    workers: int,
    interval_s: float = 0.1,
    inflated: int = 2 << 30,
    key: str | None = None,
) -> contextlib.AbstractContextManager[dict[int, int]]:
    """gzip bombs from `workers` threads (another process), each sending one every
    `interval_s` (0: back to back, which measures the machine's loopback bandwidth more than
    the proxy: 2 MB per bomb); unauthenticated unless `key` is given."""
    return abusers(_bomb, (url, inflated, interval_s, key), workers, name="bomb")


def pinned_flood(
    url: str, key: str, workers: int, profile: str
) -> contextlib.AbstractContextManager[dict[int, int]]:
    """Keyed requests pinned to `profile`, back to back from `workers` threads."""
    return abusers(_pinned, (url, key, profile), workers, name="pinned")


def items_flood(
    url: str, key: str, workers: int, size: int
) -> contextlib.AbstractContextManager[dict[int, int]]:
    """Keyed chats of `size` bytes of tiny items (tiny_items_body), back to back from
    `workers` threads (another process): each is one body in flight."""
    return abusers(_items, (url, key, size), workers, name="items")


@contextlib.contextmanager
def idle_flood(url: str, count: int) -> Iterator[dict[int, int]]:
    """`count` connections opened and left silent."""
    host, port = _address(url)
    sockets = []
    opened: dict[int, int] = {0: 0, 1: 0}
    try:
        for _ in range(count):
            try:
                sockets.append(socket.create_connection((host, port), timeout=5))
                opened[1] += 1
            except OSError:
                opened[0] += 1
        yield opened
    finally:
        for sock in sockets:
            sock.close()


LATENCY_PHASES = ("quiet", "idle_flood", "gzip_bombs", "pinned_flood")
SLOT_CASES = ("big_answer", "forwarded_stall", "trickle", "unread_streams", "restart")
"""In the order run: big_answer first, on a fresh proxy (its figure is a peak's growth)."""
CAP = 256  # the proxies' connection cap: --holders exceed it
ADMIN_KEY = "bench-abuse-admin"


def run(proxy: ProxyProcess, args: argparse.Namespace) -> dict[str, Any]:
    url = proxy.url
    phases: dict[str, Any] = {}
    quiet = keyed_latencies(url, KEY, args.requests)
    if "quiet" in args.cases:
        phases["quiet"] = {"latency": asdict(quiet)}
    floods: dict[str, Callable[[], contextlib.AbstractContextManager[dict[int, int]]]] = {
        "idle_flood": lambda: idle_flood(url, args.idle),
        "gzip_bombs": lambda: bomb_flood(url, args.bombers, args.bomb_interval),
        "pinned_flood": lambda: pinned_flood(url, KEY, args.pinned, "max"),
    }
    for name, flood in floods.items():
        if name not in args.cases:
            continue
        with flood() as answers:
            time.sleep(1.0)  # let the abuse build up (the abusers' process starts)
            latency = keyed_latencies(url, KEY, args.requests)
        seen = dict(answers)
        phases[name] = {
            "latency": asdict(latency),
            "p50_ratio": round(latency.p50 / quiet.p50, 2),
            "p99_ratio": round(latency.p99 / quiet.p99, 2),
            "abuse_answers": {str(k): v for k, v in sorted(seen.items())},
        }
    return phases


def run_slots(proxy: ProxyProcess, args: argparse.Namespace) -> dict[str, Any]:
    window, holders = args.window, args.holders
    cases: dict[str, Callable[[], dict[str, Any]]] = {
        "big_answer": lambda: slots.big_answer(proxy, KEY, args.big_mib),
        "forwarded_stall": lambda: slots.forwarded_stall(proxy, KEY, holders, window),
        "trickle": lambda: slots.trickle(proxy, KEY, holders, window),
        "unread_streams": lambda: slots.unread_streams(proxy, KEY, ECHO_SLOTS, window),
        "restart": lambda: slots.restart(proxy, KEY, ADMIN_KEY, 10, window),
    }
    return {name: case() for name, case in cases.items() if name in args.cases}


ECHO_SLOTS = 4


def _config(echo_url: str, known: set[str]) -> dict[str, Any]:
    """Every case's models on one proxy; server settings the proxy does not know left out."""
    sim_args = ["--preset", "setup-b", "--time-scale", "20", "-np", "4", "-c", "131072"]
    server = {
        "host": "127.0.0.1",
        "port": 0,
        "api_keys": [KEY],
        "admin_key": ADMIN_KEY,
        "max_queue": 32,
        "queue_timeout_s": 10.0,
        "body_timeout_s": 10.0,
        "max_connections": CAP,
        "send_timeout_s": 3.0,  # an unread stream is cut well inside the 15 s window
    }
    profiles = [
        {"name": "off"},
        {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
        {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
    ]
    return {
        "server": {key: value for key, value in server.items() if key in known},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0},
        "models": [
            {"name": "mtp-demo", "backend": "simulator", "args": sim_args, "profiles": profiles},
            {
                "name": slots.ONE,
                "backend": "simulator",
                "draft_control": "per-request",
                "args": sim_args,
                "profiles": profiles,
            },
            {
                "name": slots.ECHO,
                "backend": "simulator",
                "slots": ECHO_SLOTS,
                "profiles": [{"name": "e", "url": echo_url}],
            },
        ],
    }


def known_server_settings(checkout: Path | None) -> set[str]:
    """The [server] settings the proxy of `checkout` (None: this one) knows."""
    code = (
        "import json; from proxy.config.settings import ServerSettings; "
        "print(json.dumps(list(ServerSettings.model_fields)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, check=True
    )
    return set(json.loads(done.stdout))


def _print(phases: dict[str, Any]) -> None:
    columns = ("p50 ms", "p99 ms", "p50 x", "p99 x", "errors")
    print(
        f"{'phase':<14} {columns[0]:>8} {columns[1]:>8} {columns[2]:>6} {columns[3]:>6} "
        f"{columns[4]:>6}  abuse answers (status: count; idle: 1 = opened)"
    )
    for name, phase in phases.items():
        latency = phase["latency"]
        print(
            f"{name:<14} {latency['p50'] * 1e3:8.1f} {latency['p99'] * 1e3:8.1f} "
            f"{phase.get('p50_ratio', 1.0):6.2f} {phase.get('p99_ratio', 1.0):6.2f} "
            f"{latency['errors']:6d}  {phase.get('abuse_answers', '')}"
        )


def _slot_line(name: str, case: dict[str, Any]) -> str:
    if name == "big_answer":
        return (
            f"{case['answer_mib']} MiB relayed ({case['status']}), proxy peak memory "
            f"+{case['growth_mib']} MiB ({case['peak_before_mib']} -> {case['peak_after_mib']})"
        )
    line = f"keyed requests served {case['served']} {case['probes']}"
    if name == "restart":
        return line + f", 503s: {case['503s']}"
    return line + f"; abusers got {case['abusers']}"


def _print_slots(sides: dict[str, dict[str, Any]]) -> None:
    for name in SLOT_CASES:
        shown = [(side, result["slots"].get(name)) for side, result in sides.items()]
        shown = [(side, case) for side, case in shown if case is not None]
        if not shown:
            continue
        print(f"\n{name}")
        for side, case in shown:
            print(f"  {side:<7} {_slot_line(name, case)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=60, help="keyed chats per phase")
    parser.add_argument("--idle", type=int, default=2000, help="idle connections")
    parser.add_argument("--bombers", type=int, default=4, help="threads sending gzip bombs")
    parser.add_argument(
        "--bomb-interval", type=float, default=0.1, help="seconds between one thread's bombs"
    )
    parser.add_argument("--pinned", type=int, default=64, help="threads sending pinned requests")
    parser.add_argument(
        "--cases",
        type=lambda v: [c for c in v.split(",") if c],
        default=[*LATENCY_PHASES, *SLOT_CASES],
        help="which phases and cases (comma-separated)",
    )
    parser.add_argument("--window", type=float, default=15.0, help="seconds of probes per case")
    parser.add_argument("--holders", type=int, default=CAP + 64, help="stalled connections")
    parser.add_argument("--big-mib", type=int, default=128, help="the big answer's size")
    parser.add_argument("--baseline", type=Path, help="another checkout, run first (before)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    checkouts: dict[str, Path | None] = {"after": None}
    if args.baseline is not None:
        checkouts = {"before": args.baseline.resolve(), **checkouts}
    sides: dict[str, dict[str, Any]] = {}
    with ended_by_signals(), tempfile.TemporaryDirectory(prefix="bench-abuse-") as workdir:
        echo = start_server(["tests.support.misbehaving_backend", "--chunks", "3"])
        try:
            for side, checkout in checkouts.items():
                config = _config(echo.url, known_server_settings(checkout))
                proxy = start_proxy(config, Path(workdir) / side, checkout=checkout)
                try:
                    held = run_slots(proxy, args)  # first: big_answer wants a fresh proxy
                    sides[side] = {"phases": run(proxy, args), "slots": held}
                finally:
                    proxy.stop()
        finally:
            echo.stop()
    if args.json:
        print(json.dumps(sides, indent=2))
        return 0
    for side, result in sides.items():
        if result["phases"]:
            print(f"\n[{side}]")
            _print(result["phases"])
    _print_slots(sides)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

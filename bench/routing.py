"""Routing benchmark: replay one trace under several routing policies, side by side.

    python -m bench.routing [--trace FILE] [--preset setup-a,setup-b] [--time-scale F]
                            [--repeat N] [--json] [--plot FILE.png] [--relearn]

For each preset and policy a fresh proxy starts with a fresh simulated pool (cold caches, nothing
learned: -np 4 per backend) and the same trace is replayed with the same arrival schedule and
the same seeds (simulator and proxy):

- ``static:<p>``: every request pinned to profile p (X-MTP-Profile). By default the pool runs
  three replicas of p: the same hardware as the off/min/max pool of the other policies, so the
  comparison is about draft settings, not about having three backends instead of one
  (``--static-pool shared`` pins within the off/min/max pool: one third of the hardware);
- ``rules``: the proxy's policy with ``routing.learning = false``: cold rules only;
- ``adaptive``: the proxy's default policy;
- ``oracle``: each request pinned to the profile whose backend the simulator predicts fastest
  for it (POST /sim/predict on every backend: its caches and load), skipping backends whose
  slots its own requests fill. It is greedy: it never gives up one request's speed for a later
  one's (it does not place an agent session for what it will become, nor spare other sessions'
  caches), so a policy can beat it.

Goodput is output tokens per second the clients waited (see bench/routing_report.py); latencies
are in simulated seconds (wall x time scale). The proxies run with ``routing.clock_scale`` =
the time scale, so speeds they measure with their own clock are in simulated seconds too.
The default time scale (20) replays the default trace (~800 simulated seconds) in ~40 s per
policy: both presets, six policies, about 9 minutes on 2 cores. Wall-clock noise (other
processes on the machine) enters the latencies multiplied by the time scale, and it decides
races (which request reaches a backend first) that then change the routing: at 40 (4.5 minutes)
two runs on a shared 2-core machine differed by up to 10 % in goodput, at 20 by under 0.1 %.

``--relearn`` replays the "shift" trace (short chats whose content turns from prose to code
half-way) on a pool whose max profile drafts badly on code (``--acceptance-scale code=0.25``)
and reports, per policy, where the code requests went, ten by ten.

The default trace is bench/traces/default.jsonl: bench.trace_gen's output for its default seed,
shipped (~5 MB) so that every checkout replays the very same requests, and regenerated from the
seed when absent. Bigger workloads are generated at will (``python -m bench.trace_gen``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import trace_gen
from bench.processes import ProxyProcess, start_proxy
from bench.routing_replay import Pinner, Replayer
from bench.routing_report import STATIC_PREFIX, PolicyRun, plot, ratios, table
from bench.routing_trace import API_OF_PATH, TraceRequest, read_trace, write_trace

MODEL = "mtp-demo"
ADMIN_KEY = "bench-routing-admin"
PROFILES: dict[str, dict[str, Any]] = {
    "off": {"name": "off"},
    "min": {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    "max": {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
}
POLICIES = ("static:off", "static:min", "static:max", "rules", "adaptive", "oracle")
RELEARN_POLICIES = ("static:max", "rules", "adaptive", "oracle")
RELEARN_COLLAPSE = "code=0.25"  # --acceptance-scale of the max profile in the re-learn run


@dataclass(frozen=True)
class BenchConfig:
    preset: str
    time_scale: float
    slots: int = 4
    seed: int = 1
    static_pool: str = "replicas"
    profile_args: dict[str, list[str]] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)  # extra [routing] settings


def proxy_config(policy: str, cfg: BenchConfig) -> dict[str, Any]:
    """The proxy's configuration for one policy run."""
    sim_args = ["--preset", cfg.preset, "--time-scale", f"{cfg.time_scale:g}", "-np"]
    sim_args += [str(cfg.slots), "--seed", str(cfg.seed), "-c", "262144"]
    names = list(PROFILES)
    replicas = 1
    if policy.startswith(STATIC_PREFIX) and cfg.static_pool == "replicas":
        names, replicas = [policy.removeprefix(STATIC_PREFIX)], len(PROFILES)
    profiles = []
    for name in names:
        profile = {**PROFILES[name], "replicas": replicas}
        if cfg.profile_args.get(name):
            profile["args"] = list(cfg.profile_args[name])
        profiles.append(profile)
    routing: dict[str, Any] = {"seed": cfg.seed, "clock_scale": cfg.time_scale, **cfg.routing}
    if policy == "rules":
        routing["learning"] = False
    return {
        "server": {
            "host": "127.0.0.1",
            "port": 0,
            "admin_key": ADMIN_KEY,
            "first_byte_timeout_s": 3600.0,
            "idle_timeout_s": 3600.0,
        },
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 1.0},
        "routing": routing,
        "models": [
            {
                "name": MODEL,
                "backend": "simulator",
                "draft_control": "per-process",  # the pool: one process per profile
                "args": sim_args,
                "profiles": profiles,
            }
        ],
    }


def wait_ready(proxy: ProxyProcess, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every backend ready; returns the admin rows (profile, url, ...)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        status, body = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        rows = body.get("backends", []) if status == 200 and isinstance(body, dict) else []
        if rows and all(r.get("state") == "ready" for r in rows):
            return rows
        time.sleep(0.1)
    raise TimeoutError(f"backends not ready within {timeout}s: {rows}\n{proxy.tail()}")


class StaticPin:
    def __init__(self, profile: str) -> None:
        self.headers = {"X-MTP-Profile": profile}

    async def pin(self, r: TraceRequest) -> dict[str, str]:
        return self.headers

    def done(self, r: TraceRequest) -> None:
        pass


class Oracle:
    """Pins each request to the profile the simulator predicts fastest for it (cache and load).

    A backend whose slots are all taken by the oracle's own requests is skipped (llama-server
    would queue the request, which /sim/predict does not count) unless every one is full.
    """

    def __init__(self, backends: dict[str, str], slots: int) -> None:
        self.backends = backends  # profile -> simulator URL
        self.slots = slots
        self.in_flight = dict.fromkeys(backends, 0)
        self._pinned: dict[int, str] = {}
        self._http: aiohttp.ClientSession | None = None

    async def pin(self, r: TraceRequest) -> dict[str, str]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        data = json.dumps({**r.body, "api": API_OF_PATH[r.path]}).encode()
        headers = {"Content-Type": "application/json"}

        async def predict(url: str) -> float:
            assert self._http is not None
            async with self._http.post(url + "/sim/predict", data=data, headers=headers) as resp:
                resp.raise_for_status()
                return float((await resp.json())["total_s"])

        open_ = [p for p in self.backends if self.in_flight[p] < self.slots]
        profiles = open_ or list(self.backends)
        totals = await asyncio.gather(*(predict(self.backends[p]) for p in profiles))
        best = profiles[min(range(len(profiles)), key=lambda i: (totals[i], i))]
        self.in_flight[best] += 1
        self._pinned[r.index] = best
        return {"X-MTP-Profile": best}

    def done(self, r: TraceRequest) -> None:
        profile = self._pinned.pop(r.index, None)
        if profile is not None:
            self.in_flight[profile] -= 1

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def _pinner(
    policy: str, rows: list[dict[str, Any]], slots: int
) -> tuple[Pinner | None, Oracle | None]:
    if policy.startswith(STATIC_PREFIX):
        return StaticPin(policy.removeprefix(STATIC_PREFIX)), None
    if policy == "oracle":
        oracle = Oracle({str(r["profile"]): str(r["url"]) for r in rows}, slots)
        return oracle, oracle
    return None, None


def run_policy(
    policy: str,
    trace: list[TraceRequest],
    cfg: BenchConfig,
    workdir: Path,
    progress: bool,
) -> PolicyRun:
    proxy = start_proxy(proxy_config(policy, cfg), workdir / policy.replace(":", "-"))
    try:
        rows = wait_ready(proxy)
        pinner, oracle = _pinner(policy, rows, cfg.slots)
        replayer = Replayer(proxy.url, cfg.time_scale, pinner)
        label = f"{cfg.preset} {policy}"

        def show(done: int, total: int) -> None:
            filled = 30 * done // max(total, 1)
            bar = "#" * filled + "." * (30 - filled)
            print(f"\r  {label:<22} [{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)

        async def replay() -> float:
            try:
                return await replayer.run(trace, show if progress else None)
            finally:
                if oracle is not None:
                    await oracle.close()

        wall = asyncio.run(replay())
        if progress:
            print(file=sys.stderr)
        classes = _classes(proxy)
    finally:
        proxy.stop()
    return PolicyRun(policy, cfg.time_scale, replayer.outcomes, replayer.errors, wall, classes)


def _classes(proxy: ProxyProcess) -> dict[int, str]:
    """Request index -> the proxy's request class, from its log lines (X-Request-Id)."""
    out: dict[int, str] = {}
    for line in proxy.log_lines():
        if line.get("event") == "request" and line.get("request_class"):  # generation lines
            try:
                out[int(str(line.get("request_id")), 16)] = str(line["request_class"])
            except ValueError:
                continue
    return out


def run_preset(
    trace: list[TraceRequest], cfg: BenchConfig, policies: Sequence[str], progress: bool
) -> dict[str, PolicyRun]:
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        return {p: run_policy(p, trace, cfg, Path(tmp), progress) for p in policies}


def load_default_trace() -> list[TraceRequest]:
    path = trace_gen.DEFAULT_TRACE
    if not path.exists():
        write_trace(path, trace_gen.default_trace())
    return read_trace(path)


# --- re-learn ---------------------------------------------------------------------------------


def relearn_report(trace: list[TraceRequest], runs: dict[str, PolicyRun]) -> dict[str, Any]:
    """Per policy: where the code requests after the shift went, window by window."""
    shifted = trace_gen.shifted_requests(trace)
    out: dict[str, Any] = {"shifted_requests": len(shifted), "collapsed_profile": "max"}
    for name, run in runs.items():
        seq = sorted((o for o in run.outcomes if o.index in shifted), key=lambda o: o.sent)
        on_max = [o.profile == "max" for o in seq]
        windows = [sum(on_max[i : i + 10]) for i in range(0, len(on_max), 10)]
        # re-learned: the first code request that learned statistics sent elsewhere
        learned = [i for i, o in enumerate(seq) if o.reason == "learned" and o.profile != "max"]
        first = learned[0] + 1 if learned else None
        after = on_max[first:] if first is not None else []
        waited = sum(o.latency for o in seq) * run.time_scale
        out[name] = {
            "to_collapsed_per_10": windows,
            "relearned_after": first,
            "to_collapsed_after_share": round(sum(after) / len(after), 3) if after else None,
            "goodput_tok_s": sum(o.output_tokens for o in seq) / waited if waited else 0.0,
        }
    return out


def relearn_table(report: dict[str, Any]) -> str:
    lines = [
        f"re-learn: {report['shifted_requests']} code requests after the shift; the "
        f"{report['collapsed_profile']} profile drafts badly on code ({RELEARN_COLLAPSE})",
        f"{'policy':<12} {'goodput':>8} {'relearned':>9} {'max after':>9}  "
        "sent to max, per 10 code requests",
    ]
    for name, r in report.items():
        if isinstance(r, dict):
            share = r["to_collapsed_after_share"]
            lines.append(
                f"{name:<12} {r['goodput_tok_s']:8.2f} {r['relearned_after'] or '-':>9} "
                f"{'-' if share is None else f'{share:.0%}':>9}  {r['to_collapsed_per_10']}"
            )
    lines.append(
        "(relearned: the n-th code request is the first that learned statistics sent away "
        "from max; max after: share of the later ones still sent there, load spills included)"
    )
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", type=Path, default=None, help="JSON Lines trace (default: bundled)")
    p.add_argument("--preset", default="setup-a,setup-b", help="comma-separated presets")
    p.add_argument("--time-scale", type=float, default=20.0, help="simulated s per wall s")
    p.add_argument("--slots", type=int, default=4, help="-np of every simulated backend")
    p.add_argument("--seed", type=int, default=1, help="simulator and proxy seed")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    p.add_argument("--static-pool", choices=("replicas", "shared"), default="replicas")
    p.add_argument("--repeat", type=int, default=1, help="run everything N times (repeatability)")
    p.add_argument(
        "--routing",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [routing] setting for every proxy, e.g. cold_short_role=max (value: JSON or text)",
    )
    p.add_argument("--relearn", action="store_true", help="the workload-shift run instead")
    p.add_argument("--json", action="store_true", help="print one JSON object, no progress")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG (needs matplotlib)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    presets = [p for p in args.preset.split(",") if p]
    policies = [p for p in args.policies.split(",") if p]
    progress = not args.json
    routing = dict(_setting(item) for item in args.routing)
    extra: dict[str, list[str]] = {}
    if args.relearn:
        trace = trace_gen.shift_trace()
        policies = [p for p in policies if p in RELEARN_POLICIES] or list(RELEARN_POLICIES)
        extra = {"max": ["--acceptance-scale", RELEARN_COLLAPSE]}
    else:
        trace = read_trace(args.trace) if args.trace else load_default_trace()
    result: dict[str, Any] = {"trace": str(args.trace or "default"), "requests": len(trace)}
    last: dict[str, dict[str, PolicyRun]] = {}
    for repeat in range(args.repeat):
        run_out: dict[str, Any] = {}
        for preset in presets:
            cfg = BenchConfig(
                preset, args.time_scale, args.slots, args.seed, args.static_pool, extra, routing
            )
            runs = run_preset(trace, cfg, policies, progress)
            last[preset] = runs
            summaries = {name: run.summary() for name, run in runs.items()}
            entry: dict[str, Any] = {"policies": summaries, "ratios": ratios(summaries)}
            if args.relearn:
                entry["relearn"] = relearn_report(trace, runs)
            run_out[preset] = entry
            if not args.json:
                print(f"\nrun {repeat + 1}: " + table(preset, summaries, entry["ratios"]))
                if args.relearn:
                    print(relearn_table(entry["relearn"]))
        result.setdefault("runs", []).append(run_out)
    result["time_scale"] = args.time_scale
    result["repeatability"] = _repeatability(result["runs"])
    if args.plot is not None:
        plot(args.plot, last)
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.repeat > 1:
        print(f"\nlargest ratio difference between runs: {result['repeatability']}")
    return 0


def _setting(item: str) -> tuple[str, Any]:
    key, _, raw = item.partition("=")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def _repeatability(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per preset, the largest relative difference of any ratio between repeated runs."""
    out: dict[str, float] = {}
    for preset in runs[0]:
        worst = 0.0
        for key, first in runs[0][preset]["ratios"].items():
            if not isinstance(first, float) or not first:
                continue
            for later in runs[1:]:
                value = later[preset]["ratios"].get(key)
                if isinstance(value, float):
                    worst = max(worst, abs(value / first - 1.0))
        out[preset] = round(worst, 4)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

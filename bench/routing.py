"""Routing benchmark: replay a trace (or several) under several routing policies, side by side.

    pip install -e '.[routing]'        # the base install plus tomli-w (writes the proxies' config)
    python -m bench.routing [--topology one-process|pool] [--preset setup-a,setup-b]
                            [--trace default|concurrent|solo|NAME:SEED|FILE[,...]]
                            [--time-scale F] [--repeat N]
                            [--policies P,...] [--json] [--plot FILE.png] [--relearn]

For each preset and policy a fresh proxy starts with fresh simulated backends (cold caches,
nothing learned, -np 4 each) and the same trace is replayed with the same arrival schedule and
the same seeds (simulator and proxy). Topologies (bench/routing_topology.py):

- ``one-process`` (default): one process, one copy of the weights, started at depth 3; the
  profiles off / min / max are per-request depths 0 / 2 / 3 on it. Every row but ``pool`` runs
  on that same hardware.
- ``pool``: one process per profile (three copies of the weights).

Policies:

- ``static:<p>``: every request pinned to profile p (X-MTP-Profile): on one-process, depth 0, 2 or
  3 on the one process; on a pool, three replicas of p (the same hardware as the off/min/max pool
  of the other policies; ``--static-pool shared`` pins within that pool instead);
- ``rules``: the proxy's policy with ``routing.learning = false``: cold rules only (not run
  unless listed);
- ``adaptive``: the proxy's default policy;
- ``hindsight``: the best setting in hindsight per request class and load level
  (bench/routing_reference.py): built from the three static runs (run whether listed or not),
  then replayed with each request pinned to its cell's winner. It estimates the best a policy
  deciding from class and load alone can reach, up to the interactions between cells (a cell's
  choice changes the load and queueing others see) and run noise; it does not bound a policy
  that uses finer information (a session's own acceptance, what arrives next) or mixes settings
  within a cell.
  On one process the cells also interact through the shared step: a request at another depth
  makes every decoding request pay the mixed-depth pass, so a cell that leaves the best static
  setting can cost the others more than it gains. Not run on a pool unless asked for, and there
  only with ``--static-pool shared``: with replicas its static runs had three backends of one
  profile and the replay would put most requests on one backend of the off/min/max pool;
- ``greedy``: each request pinned to the setting the simulator predicts fastest for it against
  the same cache and load state at its send (POST /sim/predict with each depth, or on each
  backend). It never gives up one request's speed for others' (it cannot see the requests
  beside it slow down), so a policy can beat it: a counterfactual per request, not a bound;
- ``pool`` (one-process only): the adaptive policy on today's three-process pool, at three times
  the VRAM, as a reference row.

The **oracle** (the reference the ratios use) is the best of the rows that are assignments a
router could have made with hindsight or foresight: hindsight, greedy and each static setting (a
static setting is one assignment of settings to classes and load levels, so the reference is
never below the best static); ``ratios.oracle`` names the row. It is a reference, not a proven
upper bound: see what hindsight and greedy do not cover above. Ratios (``--json``: per preset
``ratios``): ``adaptive_vs_oracle``, ``adaptive_vs_best_static`` (the best static row of the
topology: on one-process, the best depth on the one process), ``gain_captured`` (adaptive's share of
the oracle's gain over the best static) and ``meets_targets`` (adaptive >= 0.97 x oracle, and
>= 80 % of the oracle's gain where that gain is >= 3 %: the routing's targets). Per preset
``reference.cells`` lists every class and load level: each static's goodput there, hindsight's
pick, and adaptive's goodput and choices, which shows where adaptive loses.

Goodput is output tokens per second the clients waited (see bench/routing_report.py); latencies
are in simulated seconds (wall x time scale). The proxies run with ``routing.clock_scale`` =
the time scale, so speeds they measure with their own clock are in simulated seconds too.
The default time scale (20) replays the default trace (~800 simulated seconds) in ~40 s per
policy. Wall-clock noise (other processes on the machine) enters the latencies multiplied by
the time scale, and it decides races (which request reaches a backend first) that then change
the routing (how much, per time scale: docs/benchmarks.md, "Repeatability"). ``--repeat N``
prints the largest difference between runs, per ratio and per policy.

``--relearn`` shows how fast a policy follows a change. On one process (the default) it replays the
"relearn" trace (short prose and code chats throughout) and half-way turns the backend's code
acceptance down (POST /sim/acceptance-scale ``code=0.2``: drafting stops paying on code); it
reports, per policy (adaptive, and adaptive without change detection beside it), where the code
requests after the change went ten by ten, and after how many of them the proxy said the code
class had changed. With ``--topology pool`` it replays the "shift" trace (content turning from
prose to code half-way) on a pool whose max profile drafts badly on code
(``--acceptance-scale code=0.25``).

Traces: ``default`` is bench/traces/default.jsonl, bench.trace_gen's output for its default
seed, shipped (~5 MB) so that every checkout replays the very same requests, and regenerated
from the seed when absent. ``concurrent`` (agents fanning out into sub-agents beside chats) is
generated from its seed on the fly, and so is ``solo`` (one person with one coding agent: a
session growing from ~10k to ~130k tokens and an occasional short chat, strictly one request
at a time). ``NAME:SEED`` is another seed of a generator
(``default:2`` is ``trace_gen.default_trace(2)``, ``concurrent:1`` its ``concurrent_trace(1)``).
Bigger workloads: ``python -m bench.trace_gen``. Several traces, comma-separated
(``--trace default,default:2,default:3``), are replayed one after another, every preset on each;
the JSON then has ``traces`` (per trace, what ``--trace`` with that trace alone would print)
instead of one trace's keys at the top.

Mean over runs: whenever a preset has more than one run (``--repeat N``, several traces, or
both), ``mean`` (and a short table) gives per preset each policy's mean goodput over all those
runs and the ratios of those means (bench/routing_report.py ``mean_report``). The default trace
keeps the one process saturated, and a saturated trace amplifies small differences: which long
agent context is still cached decides whether a turn processes 60-100k tokens again (the
simulator keeps llama-server's host-memory prompt cache, ``--cache-ram``, simulator/MODEL.md,
but setup-b's model fills it with one long context). Read the targets
(``meets_targets``) on the mean, over repeats and over seeds of one generator (``--trace
default,default:2,default:3 --repeat 2``): a mean over different generators weighs the one with
the higher goodput more. Measured figures: docs/benchmarks.md ("Routing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import trace_gen
from bench.processes import ProxyProcess, start_proxy
from bench.routing_reference import (
    GreedyPin,
    Hindsight,
    HindsightPin,
    cells_report,
    cells_table,
    choice_estimates,
    hindsight,
)
from bench.routing_replay import Outcome, Pinner, Replayer
from bench.routing_report import PolicyRun, mean_report, mean_table, plot, ratios, table
from bench.routing_topology import (
    ADMIN_KEY,
    NO_DETECTION,
    POOL_ROW,
    PROFILES,
    STATIC_PREFIX,
    TOPOLOGIES,
    BenchConfig,
    greedy_choices,
    proxy_config,
)
from proxy.workloads.trace import TraceRequest, read_trace, write_trace

STATICS = tuple(STATIC_PREFIX + p for p in PROFILES)
POLICIES = {
    "one-process": (*STATICS, "adaptive", "hindsight", "greedy", POOL_ROW),
    "pool": (*STATICS, "adaptive", "greedy"),  # hindsight: with --static-pool shared only
}
RELEARN_POLICIES = ("static:max", "rules", "adaptive", "greedy")  # on a pool
RELEARN_COLLAPSE = "code=0.25"  # --acceptance-scale of the max profile in the pool's re-learn run
RELEARN_ONE_PROCESS = ("static:off", "static:max", "adaptive", NO_DETECTION, "greedy")
RELEARN_CHANGE = "code=0.2"
"""The re-learn run on one process: the backend's code acceptance from the change on. On
setup-b's short code chats depth 3 then decodes at ~0.95x depth 0 instead of ~1.57x: drafting
stops paying, without a collapse (drafted acceptance ~17 %, over the guard's 15 %)."""


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

    async def pin(self, r: TraceRequest, load: int) -> dict[str, str]:
        return self.headers

    def done(self, r: TraceRequest) -> None:
        pass


def _pinner(
    policy: str, rows: list[dict[str, Any]], cfg: BenchConfig, reference: Reference | None
) -> tuple[Pinner | None, GreedyPin | None]:
    if policy.startswith(STATIC_PREFIX):
        return StaticPin(policy.removeprefix(STATIC_PREFIX)), None
    if policy == "hindsight":
        if reference is None:
            raise ValueError("the hindsight reference needs the static runs first")
        return HindsightPin(reference.hindsight, reference.classes), None
    if policy == "greedy":
        greedy = GreedyPin(greedy_choices(rows, cfg.topology), cfg.slots)
        return greedy, greedy
    return None, None


@dataclass(frozen=True)
class Reference:
    hindsight: Hindsight
    classes: dict[int, str]
    estimates: dict[str, Any]


def run_policy(
    policy: str,
    trace: list[TraceRequest],
    cfg: BenchConfig,
    workdir: Path,
    progress: bool,
    reference: Reference | None = None,
) -> PolicyRun:
    proxy = start_proxy(proxy_config(policy, cfg), workdir / policy.replace(":", "-"))
    try:
        rows = wait_ready(proxy)
        pinner, oracle = _pinner(policy, rows, cfg, reference)
        replayer = Replayer(proxy.url, cfg.time_scale, pinner)
        label = f"{cfg.preset} {policy}"

        def show(done: int, total: int) -> None:
            filled = 30 * done // max(total, 1)
            bar = "#" * filled + "." * (30 - filled)
            print(f"\r  {label:<22} [{bar}] {done}/{total}", end="", file=sys.stderr, flush=True)

        async def replay() -> float:
            try:
                return await replayer.run(trace, show if progress else None, _timed(rows, cfg))
            finally:
                if oracle is not None:
                    await oracle.close()

        wall = asyncio.run(replay())
        if progress:
            print(file=sys.stderr)
        classes = _classes_of(proxy, len(replayer.outcomes) + len(replayer.errors))
        events = [line for line in proxy.log_lines() if line.get("event") in _EVENTS]
    finally:
        proxy.stop()
    run = PolicyRun(policy, cfg.time_scale, replayer.outcomes, replayer.errors, wall, classes)
    run.events = events
    return run


_EVENTS = ("request", "class_changed", "acceptance_collapsed", "acceptance_recovered")


def _timed(
    rows: list[dict[str, Any]], cfg: BenchConfig
) -> list[tuple[float, Callable[[], Awaitable[None]]]]:
    """The re-learn run on one process: the code acceptance changes at the trace's change."""
    if cfg.change is None or cfg.topology != "one-process":
        return []
    url, change = str(rows[0]["url"]), cfg.change

    async def turn() -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(url + "/sim/acceptance-scale", json={"acceptance_scale": change}) as r,
        ):
            r.raise_for_status()

    return [(trace_gen.SHIFT_AT, turn)]


def _classes_of(proxy: ProxyProcess, sent: int, timeout: float = 5.0) -> dict[int, str]:
    """The classes of all ``sent`` requests from the proxy's log. A request's line is written
    after its answer has gone out (deferred bookkeeping, flushed by GET /admin/routing), which
    can be a moment after the client read its last byte: poll until every one is there."""
    deadline = time.monotonic() + timeout
    while True:
        proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        classes = _classes(proxy)
        if len(classes) >= sent or time.monotonic() > deadline:
            return classes
        time.sleep(0.05)


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
) -> tuple[dict[str, PolicyRun], Reference | None]:
    """Every policy on a fresh proxy; the static ones first, since the hindsight reference is
    built from them (all three run when it is asked for, listed or not: all are shown)."""
    statics = [p for p in policies if p.startswith(STATIC_PREFIX)]
    if "hindsight" in policies:
        statics = [STATIC_PREFIX + p for p in PROFILES]
    others = [p for p in policies if not p.startswith(STATIC_PREFIX)]
    runs: dict[str, PolicyRun] = {}
    reference: Reference | None = None
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        for policy in statics:
            runs[policy] = run_policy(policy, trace, cfg, Path(tmp), progress)
        if "hindsight" in policies:
            classes: dict[int, str] = {}
            for run in runs.values():
                classes = {**run.classes, **classes}
            static_runs = {p.removeprefix(STATIC_PREFIX): runs[p] for p in statics}
            estimates = choice_estimates(static_runs, classes)
            reference = Reference(hindsight(static_runs, classes), classes, estimates)
        for policy in others:
            runs[policy] = run_policy(policy, trace, cfg, Path(tmp), progress, reference)
    return {p: runs[p] for p in [*statics, *others]}, reference


def load_default_trace() -> list[TraceRequest]:
    path = trace_gen.DEFAULT_TRACE
    if not path.exists():
        write_trace(path, trace_gen.default_trace())
    return read_trace(path)


GENERATED = {
    "default": trace_gen.default_trace,
    "concurrent": trace_gen.concurrent_trace,
    "solo": trace_gen.solo_trace,
}


def generated_trace(name: str) -> tuple[str, int] | None:
    """(scenario, seed) of a generated trace's name ("default", "concurrent:3"); None when the
    name is no generated scenario's (a file). ValueError on a seed that is no whole number."""
    scenario, colon, seed = name.partition(":")
    if scenario not in GENERATED:
        return None
    if not colon:
        return scenario, trace_gen.DEFAULT_SEED
    if not seed.isascii() or not seed.isdigit():
        raise ValueError(f"trace {name!r}: the seed after ':' must be a whole number >= 0")
    return scenario, int(seed)


def load_trace(name: str) -> list[TraceRequest]:
    """A generated trace by name (default, concurrent, NAME:SEED) or a JSON Lines file."""
    generated = generated_trace(name)
    if generated is None:
        return read_trace(Path(name))
    scenario, seed = generated
    if scenario == "default" and seed == trace_gen.DEFAULT_SEED:
        return load_default_trace()  # the shipped file: the same requests
    return GENERATED[scenario](seed)


def trace_names(value: str) -> list[str]:
    """``--trace``: comma-separated trace names, each checked (an argparse type)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no trace given")
    for name in names:
        try:
            generated = generated_trace(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if generated is None and not Path(name).is_file():
            raise argparse.ArgumentTypeError(
                f"trace {name!r}: neither {', '.join(GENERATED)}, NAME:SEED of one of those, "
                "nor a file"
            )
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"a trace given twice in {value!r}")
    return names


# --- re-learn ---------------------------------------------------------------------------------


def relearn_report(
    trace: list[TraceRequest], runs: dict[str, PolicyRun], topology: str = "pool"
) -> dict[str, Any]:
    """Per policy: where the code requests after the shift went, window by window. A pool: the
    shift trace's code requests and the max profile's process, bad on code from the start. One
    copy: the relearn trace's code requests after the backend's code acceptance turned down,
    and whether they drafted (min or max) or not; and after how many of them the proxy said the
    code class had changed (its log's class_changed)."""
    one_process = topology == "one-process"
    shifted = (trace_gen.changed_requests if one_process else trace_gen.shifted_requests)(trace)
    out: dict[str, Any] = {
        "shifted_requests": len(shifted),
        "collapsed_profile": "min/max" if one_process else "max",
    }
    for name, run in runs.items():
        seq = sorted((o for o in run.outcomes if o.index in shifted), key=lambda o: o.sent)
        on_max = [(o.profile != "off") if one_process else (o.profile == "max") for o in seq]
        windows = [sum(on_max[i : i + 10]) for i in range(0, len(on_max), 10)]
        first = _relearned_after(seq, one_process)
        after = on_max[first:] if first is not None else []
        waited = sum(o.latency for o in seq) * run.time_scale
        out[name] = {
            "to_collapsed_per_10": windows,
            "relearned_after": first,
            "to_collapsed_after_share": round(sum(after) / len(after), 3) if after else None,
            "goodput_tok_s": sum(o.output_tokens for o in seq) / waited if waited else 0.0,
        }
        if one_process:
            out[name]["detected_after"] = _detected_after(run, shifted)
    return out


def _relearned_after(seq: list[Outcome], one_process: bool) -> int | None:
    """The n-th changed code request (1-based) that learned statistics were the first to send
    away from the collapsed profile. One process: to depth 0, by its class's statistics or by its
    process's busy epoch (chosen from learned busy speeds: every changed request admitted beside
    another goes so), once an earlier one had drafted (an epoch at depth 0 from the start is
    no re-learning); depth 2 is still drafting. A pool: off or min by its class's statistics."""
    drafted = False
    for n, outcome in enumerate(seq, start=1):
        if not one_process:
            if outcome.reason == "learned" and outcome.profile != "max":
                return n
        elif outcome.profile != "off":
            drafted = True
        elif drafted and outcome.reason in ("learned", "busy"):
            return n
    return None


def _detected_after(run: PolicyRun, shifted: set[int]) -> int | None:
    """How many of the changed code requests had been answered when the proxy first said a code
    class changed (None: it never did)."""
    answered = 0
    for line in run.events:
        if line.get("event") == "request":
            try:
                answered += int(str(line.get("request_id")), 16) in shifted
            except ValueError:
                continue
        elif line.get("event") == "class_changed" and answered and "/code" in str(line["class"]):
            return answered
    return None


def relearn_table(report: dict[str, Any]) -> str:
    profile = report["collapsed_profile"]
    if profile == "max":
        what = f"the max profile drafts badly on code ({RELEARN_COLLAPSE})"
    else:
        what = f"the backend's code acceptance turned down then ({RELEARN_CHANGE})"
    lines = [
        f"re-learn: {report['shifted_requests']} code requests after the change; {what}",
        f"{'policy':<18} {'goodput':>8} {'detected':>8} {'relearned':>9} {'drafting':>9}  "
        f"sent to {profile}, per 10 code requests",
    ]
    for name, r in report.items():
        if isinstance(r, dict):
            share = r["to_collapsed_after_share"]
            detected = r.get("detected_after")
            lines.append(
                f"{name:<18} {r['goodput_tok_s']:8.2f} {detected or '-':>8} "
                f"{r['relearned_after'] or '-':>9} "
                f"{'-' if share is None else f'{share:.0%}':>9}  {r['to_collapsed_per_10']}"
            )
    lines.append(
        "(detected: code requests answered when the proxy said the code class changed; "
        f"relearned: the n-th code request is the first that learned statistics (busy epochs "
        f"included) sent away from {profile}; drafting: share of the later ones still sent there, "
        "spills included)"
    )
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--trace",
        type=trace_names,
        default="default",
        help="default | concurrent | solo | NAME:SEED (another seed of those) | a JSON Lines file; "
        "several comma-separated: replayed in turn, with the mean over all runs",
    )
    p.add_argument("--topology", choices=sorted(TOPOLOGIES), default="one-process")
    p.add_argument("--preset", default="setup-a,setup-b", help="comma-separated presets")
    p.add_argument("--time-scale", type=float, default=20.0, help="simulated s per wall s")
    p.add_argument("--slots", type=int, default=4, help="-np of every simulated backend")
    p.add_argument("--seed", type=int, default=1, help="simulator and proxy seed")
    p.add_argument("--policies", default=None, help="comma-separated (default: the topology's)")
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
    listed = args.policies or ",".join(POLICIES[args.topology])
    policies = [p for p in listed.split(",") if p]
    routing = dict(_setting(item) for item in args.routing)
    extra: dict[str, list[str]] = {}
    topology = args.topology
    if "hindsight" in policies and topology == "pool" and args.static_pool != "shared":
        _parser().error("hindsight on a pool needs --static-pool shared (the same hardware)")
    change = None
    if args.relearn and topology == "pool":
        traces = {"shift": trace_gen.shift_trace()}
        policies = [p for p in policies if p in RELEARN_POLICIES] or list(RELEARN_POLICIES)
        extra = {"max": ["--acceptance-scale", RELEARN_COLLAPSE]}
    elif args.relearn:  # one process: the backend's code acceptance turns down half-way
        traces = {"relearn": trace_gen.relearn_trace()}
        listed = [p for p in policies if p in RELEARN_ONE_PROCESS]
        policies = listed if args.policies else list(RELEARN_ONE_PROCESS)
        change = RELEARN_CHANGE
    else:
        traces = {name: load_trace(name) for name in args.trace}
    configs = [
        BenchConfig(
            preset,
            args.time_scale,
            topology,
            args.slots,
            args.seed,
            args.static_pool,
            extra,
            routing,
            change,
        )
        for preset in presets
    ]
    last: dict[str, dict[str, PolicyRun]] = {}
    results = {
        name: run_trace(name, trace, configs, policies, args, last)
        for name, trace in traces.items()
    }
    if len(results) == 1:
        result = next(iter(results.values()))
    else:
        every = [run for r in results.values() for run in r["runs"]]
        result = {
            "topology": topology,
            "time_scale": args.time_scale,
            "traces": results,
            "mean": mean_report(every),
        }
        if not args.json:
            print("\n" + mean_table(f"traces {', '.join(results)}", result["mean"]))
    if args.plot is not None:
        plot(args.plot, last)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


def run_trace(
    name: str,
    trace: list[TraceRequest],
    configs: list[BenchConfig],
    policies: list[str],
    args: argparse.Namespace,
    last: dict[str, dict[str, PolicyRun]],
) -> dict[str, Any]:
    """Every preset on one trace, ``--repeat`` times: the JSON of one trace (``last``: the last
    run's policy runs per preset, for the plot)."""
    topology = configs[0].topology if configs else args.topology
    result: dict[str, Any] = {"trace": name, "topology": topology, "requests": len(trace)}
    result["runs"] = []
    for repeat in range(args.repeat):
        run_out: dict[str, Any] = {}
        for cfg in configs:
            runs, reference = run_preset(trace, cfg, policies, progress=not args.json)
            last[cfg.preset] = runs
            summaries = {policy: run.summary() for policy, run in runs.items()}
            entry: dict[str, Any] = {"policies": summaries, "ratios": ratios(summaries)}
            if reference is not None:
                entry["reference"] = {
                    "fallback": reference.hindsight.fallback,
                    "cells": cells_report(reference.hindsight, runs, reference.classes),
                    "estimates": reference.estimates,
                }
            if args.relearn:
                entry["relearn"] = relearn_report(trace, runs, topology)
            run_out[cfg.preset] = entry
            if not args.json:
                title = f"{cfg.preset}, {topology}, trace {name}"
                print(f"\nrun {repeat + 1}: " + table(title, summaries, entry["ratios"]))
                if reference is not None:
                    print(cells_table(entry["reference"]["cells"]))
                    print(f"perfect choices, estimated from the static runs: {reference.estimates}")
                if args.relearn:
                    print(relearn_table(entry["relearn"]))
        result["runs"].append(run_out)
    result["time_scale"] = args.time_scale
    result["repeatability"] = _repeatability(result["runs"])
    result["repeatability_goodput"] = _goodput_spread(result["runs"])
    if len(result["runs"]) > 1:
        result["mean"] = mean_report(result["runs"])
    if not args.json and args.repeat > 1:
        print(f"\ntrace {name}, largest ratio difference between runs: {result['repeatability']}")
        print(f"largest goodput difference between runs: {result['repeatability_goodput']}")
        print(mean_table(f"trace {name}", result["mean"]))
    return result


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


def _goodput_spread(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per preset and policy, the largest relative goodput difference between repeated runs."""
    out: dict[str, dict[str, float]] = {}
    for preset, entry in runs[0].items():
        out[preset] = {}
        for policy in entry["policies"]:
            values = [r[preset]["policies"][policy]["goodput_tok_s"] for r in runs]
            low, high = min(values), max(values)
            out[preset][policy] = round(high / low - 1.0, 4) if low > 0 else 0.0
    return out


if __name__ == "__main__":
    raise SystemExit(main())

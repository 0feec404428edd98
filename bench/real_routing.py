"""Routing on a real engine: adaptive against static depths, through the real proxy, side by side.

    python -m bench.real_routing [--llama-server BIN] [--model GGUF] [--quick] [--out FILE.json]
        [--spec-type ngram-mod] [--depths 8,16] [--rounds 6] [--concurrent-rounds 5]
        [--control-rounds 4] [--tokens 128]

Every arm is its own ``mtp-proxy serve`` in front of its own patched llama-server (one process
serving per-request depths, ``"speculative.n_max"``; ``-t 1 -np 4``), on Gemma 3 270M Q4_K_M by
default ($MTP_MODEL_GEMMA3_270M, else the fetch script's cache; the binary: --llama-server, else
$MTP_PATCHED_LLAMA_SERVER). The profiles are off / min / max at depths 0 / 8 / 16 of one
n-gram type (ngram-mod: what ``mtp-proxy init`` writes for this GGUF, and the type that paid on
prose too in bench/spec_depths.py). Arms: ``static:off``, ``static:min`` and ``static:max`` pin
every request to one profile (X-MTP-Profile); ``adaptive`` is the proxy's own routing, which
learns only from its own traffic and calibrates its backend at start-up (static arms skip that).
Processes start one after another, so a calibration runs on a quiet machine.

Traces (bench/real_routing_trace.py): rounds of greedy chat completions of six classes (a short
code edit, new code, a file to copy or refactor, prose, chat, and one agent session whose context
grows every round). Scenarios: ``alone`` (one client, one request at a time), then
``concurrent`` (four clients, up to four requests decoding at once). Each round goes through every
arm in turn, the arms' order rotating round by round, so the machine's drift falls on all alike.
Then the ``draft-simple control``: the same profiles of draft-simple with the model as its own
draft (every drafted token costs a full pass: drafting cannot pay), the five one-shot classes for
``--control-rounds`` rounds (20 requests), on fresh processes: does adaptive stop drafting and
reach >= 0.95x static off?

The report (also --out JSON): first the headline, adaptive / the best static arm per trace;
then per scenario each class's goodput per arm, the best static arm, adaptive's ratio to it and
its profiles and reasons; the start-up calibration's verdict; the proxy's class for each trace
class against the kind it is meant to be. Exit 1 when a request failed. 43 minutes with the
defaults on two cores shared with other benchmarks (load average 6-7); ``--quick`` (a round of
each scenario, 16 tokens, prompts a quarter the size) a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.processes import ProxyProcess, ended_by_signals, start_proxy
from bench.real_routing_report import (
    ADAPTIVE,
    STATIC_PREFIX,
    Record,
    classifier_report,
    draft_control_report,
    headline,
    markdown_table,
    records_json,
    render,
    scenario_report,
)
from bench.real_routing_trace import (
    MODEL,
    Numbering,
    Round,
    alone_rounds,
    concurrent_rounds,
    short_rounds,
)
from bench.routing import StaticPin, wait_ready
from bench.routing_replay import Outcome, Replayer
from bench.routing_topology import ADMIN_KEY
from supervisor.spec_types import NGRAM_MOD_ARGS

ARMS = ("static:off", "static:min", "static:max", ADAPTIVE)
CONTROL_ARMS = ("static:off", ADAPTIVE)  # how much drafting loses: the calibration's verdict
CONTROL_TYPE = "draft-simple"
BINARY_ENV = "MTP_PATCHED_LLAMA_SERVER"
MODEL_ENV = "MTP_MODEL_GEMMA3_270M"


@dataclass(frozen=True)
class Plan:
    binary: str
    model: Path
    spec_type: str = "ngram-mod"
    depths: tuple[int, int] = (8, 16)
    rounds: int = 6
    concurrent_rounds: int = 5
    control_rounds: int = 4
    tokens: int = 128
    scale: float = 1.0  # of the prompts' texts
    clients: int = 4
    ctx: int = 32768
    calibration_tokens: int = 96
    seed: int = 1
    arms: tuple[str, ...] = ARMS
    control_arms: tuple[str, ...] = CONTROL_ARMS
    ready_timeout_s: float = 900.0

    @property
    def depth_of(self) -> dict[str, int]:
        return {"off": 0, "min": self.depths[0], "max": self.depths[1]}


QUICK: dict[str, Any] = {
    "rounds": 1,
    "concurrent_rounds": 1,
    "control_rounds": 1,
    "tokens": 16,
    "scale": 0.25,
    "calibration_tokens": 16,
    "arms": ("static:off", "static:max", ADAPTIVE),
}


def model_entry(plan: Plan, spec_type: str) -> dict[str, Any]:
    """One llama-server at the deepest depth; off / min / max are per-request depths on it."""
    low, high = plan.depths
    drafting: dict[str, Any] = {"spec_type": spec_type}
    if spec_type.startswith("draft-"):
        drafting["draft_model"] = str(plan.model)  # the target as its own draft
    args = ["-c", str(plan.ctx), "-np", str(plan.clients), "-t", "1"]
    if spec_type == "ngram-mod":  # its default n_min (48) drafts only 48-token runs
        args += [*NGRAM_MOD_ARGS[:2], "--spec-ngram-mod-n-max", str(high)]
    return {
        "name": MODEL,
        "backend": "llama-server",
        "binary": plan.binary,
        "model_path": str(plan.model),
        "draft_control": "per-request",
        "args": args,
        "profiles": [
            {"name": "off"},
            {"name": "min", **drafting, "draft_n_max": low},
            {"name": "max", **drafting, "draft_n_max": high},
        ],
    }


def proxy_config(plan: Plan, arm: str, spec_type: str) -> dict[str, Any]:
    """An arm's proxy: calibrated at start-up only where it routes (adaptive)."""
    routing = {
        "seed": plan.seed,
        "calibrate": "auto" if arm == ADAPTIVE else "off",
        "calibration_tokens": plan.calibration_tokens,
        "calibration_timeout_s": plan.ready_timeout_s / 2,
    }
    return {
        "server": {
            "host": "127.0.0.1",
            "port": 0,
            "admin_key": ADMIN_KEY,
            "queue_timeout_s": 600.0,
            "idle_timeout_s": 600.0,
        },
        "log": {"level": "info", "format": "json"},
        "supervisor": {
            "stagger_s": 0.0,
            "health_timeout_s": 10.0,  # two busy cores: a /health answer can take seconds
            "unhealthy_after_s": 120.0,
            "replace_after_s": 120.0,
            "ready_timeout_s": plan.ready_timeout_s,
            "probe_timeout_s": 120.0,
        },
        "routing": routing,
        "models": [model_entry(plan, spec_type)],
    }


@dataclass
class Arm:
    name: str
    proxy: ProxyProcess
    sent: int = 0

    @property
    def pinner(self) -> StaticPin | None:
        if self.name.startswith(STATIC_PREFIX):
            return StaticPin(self.name.removeprefix(STATIC_PREFIX))
        return None


@dataclass
class Family:
    """The arms of one speculative type, and what they measured."""

    spec_type: str
    arms: list[Arm]
    records: list[Record] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def start_family(plan: Plan, spec_type: str, names: Sequence[str], workdir: Path) -> Family:
    """The arms' proxies, one after another, each once its backend is ready (and calibrated)."""
    family = Family(spec_type, [])
    try:
        for name in names:
            began = time.monotonic()
            config = proxy_config(plan, name, spec_type)
            where = workdir / f"{spec_type}-{name.replace(':', '-')}"
            proxy = start_proxy(config, where, wait=False)  # ready after its calibration
            family.arms.append(Arm(name, proxy))
            wait_ready(proxy, timeout=plan.ready_timeout_s)
            _say(f"{spec_type} {name}: ready in {time.monotonic() - began:.0f} s")
    except BaseException:
        stop_family(family)
        raise
    return family


def stop_family(family: Family) -> None:
    for arm in family.arms:
        arm.proxy.stop()


def replay(arm: Arm, items: Round, scenario: str, round_no: int) -> tuple[list[Record], list[str]]:
    """One round through one arm; its records (the proxy's log fields come later)."""
    replayer = Replayer(arm.proxy.url, 1.0, arm.pinner)
    asyncio.run(replayer.run([item.request for item in items]))
    arm.sent += len(items)
    cls_of = {item.request.index: item.cls for item in items}
    records = [_record(o, scenario, arm.name, round_no, cls_of[o.index]) for o in replayer.outcomes]
    errors = [f"{scenario} {arm.name}: {error}" for error in replayer.errors]
    return records, errors


def _record(o: Outcome, scenario: str, arm: str, round_no: int, cls: str) -> Record:
    decode = 1e3 * o.predicted_n / o.predicted_ms if o.predicted_n and o.predicted_ms else None
    return Record(
        scenario, arm, round_no, cls, o.index, o.output_tokens, o.latency, decode,
        o.profile, o.reason, o.load,
    )  # fmt: skip


def run_rounds(family: Family, rounds: list[Round], scenario: str) -> None:
    """Every round through every arm in turn; the first arm of a round rotates."""
    for n, items in enumerate(rounds):
        arms = family.arms[n % len(family.arms) :] + family.arms[: n % len(family.arms)]
        said = []
        for arm in arms:
            records, errors = replay(arm, items, scenario, n)
            family.records += records
            family.errors += errors
            speed = sum(r.output_tokens for r in records) / max(
                sum(r.latency_s for r in records), 1e-9
            )
            said.append(f"{arm.name} {speed:.1f}")
        _say(f"{family.spec_type} {scenario} round {n + 1}/{len(rounds)}: {', '.join(said)} tok/s")


def logged(arm: Arm, timeout: float = 10.0) -> dict[int, dict[str, Any]]:
    """The proxy's request lines by request index. A line is written a moment after its answer
    went out (deferred bookkeeping, flushed by GET /admin/routing): poll until all are there."""
    deadline = time.monotonic() + timeout
    while True:
        arm.proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        lines: dict[int, dict[str, Any]] = {}
        for line in arm.proxy.log_lines():
            if line.get("event") == "request" and line.get("request_class"):
                try:
                    lines[int(str(line.get("request_id")), 16)] = line
                except ValueError:
                    continue
        if len(lines) >= arm.sent or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def finish_family(family: Family) -> dict[str, Any]:
    """The proxy's class and acceptance onto every record; the adaptive arm's calibration and
    every arm's backend as /admin/backends shows it."""
    lines: dict[str, dict[int, dict[str, Any]]] = {a.name: logged(a) for a in family.arms}
    family.records = [
        replace(
            r,
            proxy_class=lines[r.arm].get(r.index, {}).get("request_class"),
            acceptance=lines[r.arm].get(r.index, {}).get("acceptance"),
        )
        for r in family.records
    ]
    calibration: dict[str, Any] = {}
    backends: dict[str, Any] = {}
    for arm in family.arms:
        _, routing = arm.proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        if arm.name == ADAPTIVE:
            calibration = routing.get("calibration") or {}
        _, rows = arm.proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        backends[arm.name] = [
            {k: row.get(k) for k in ("name", "state", "draft_control", "draft_control_reason")}
            for row in rows.get("backends", [])
        ]
    return {"calibration": calibration, "backends": backends}


def run_family(
    plan: Plan,
    spec_type: str,
    names: Sequence[str],
    scenarios: dict[str, list[Round]],
    workdir: Path,
) -> tuple[Family, dict[str, Any]]:
    family = start_family(plan, spec_type, names, workdir)
    try:
        for scenario, rounds in scenarios.items():
            run_rounds(family, rounds, scenario)
        return family, finish_family(family)
    finally:
        stop_family(family)


def run(plan: Plan, workdir: Path) -> dict[str, Any]:
    numbering = Numbering()
    scenarios = {
        "alone": alone_rounds(plan.rounds, plan.seed, plan.tokens, numbering, plan.scale),
        "concurrent": concurrent_rounds(
            plan.concurrent_rounds, plan.seed + 1, plan.tokens, plan.clients, numbering, plan.scale
        ),
    }
    control = {
        "control": short_rounds(
            plan.control_rounds, plan.seed + 2, plan.tokens, numbering, plan.scale
        )
    }
    began = time.monotonic()
    main, main_info = run_family(plan, plan.spec_type, plan.arms, scenarios, workdir)
    report: dict[str, Any] = {
        "model": str(plan.model),
        "binary": plan.binary,
        "spec_type": plan.spec_type,
        "depths": plan.depth_of,
        "arms": list(plan.arms),
        "control_arms": list(plan.control_arms),
        "plan": {k: v for k, v in vars(plan).items() if k not in ("binary", "model")},
        "scenarios": {
            name: scenario_report([r for r in main.records if r.scenario == name], plan.arms)
            for name in scenarios
        },
        "calibration": {f"{plan.spec_type} adaptive": main_info["calibration"]},
        "backends": {plan.spec_type: main_info["backends"]},
        "errors": list(main.errors),
    }
    records = list(main.records)
    if plan.control_rounds > 0 and plan.control_arms:
        ctl, ctl_info = run_family(plan, CONTROL_TYPE, plan.control_arms, control, workdir)
        report["draft_control"] = draft_control_report(ctl.records, plan.control_arms)
        report["calibration"][f"{CONTROL_TYPE} adaptive"] = ctl_info["calibration"]
        report["backends"][CONTROL_TYPE] = ctl_info["backends"]
        report["errors"] += ctl.errors
        records += ctl.records
    report["classifier"] = classifier_report(records)
    report["headline"] = headline(report)
    report["wall_s"] = round(time.monotonic() - began, 1)
    report["records"] = records_json(records)
    return report


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _depths(value: str) -> tuple[int, int]:
    try:
        low, high = (int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("two depths, min and max: e.g. 8,16") from None
    if not 1 <= low < high <= 64:
        raise argparse.ArgumentTypeError("depths must satisfy 1 <= min < max <= 64")
    return low, high


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.real_routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--llama-server", default=os.environ.get(BINARY_ENV), help=f"${BINARY_ENV}")
    p.add_argument("--model", type=Path, default=None, help=f"${MODEL_ENV}, else the cache")
    p.add_argument("--spec-type", default="ngram-mod", help="the static and adaptive arms' type")
    p.add_argument("--depths", type=_depths, default=(8, 16), help="min,max (off is 0)")
    p.add_argument("--rounds", type=int, default=None, help="alone rounds (default 6)")
    p.add_argument("--concurrent-rounds", type=int, default=None, help="(default 5)")
    p.add_argument("--control-rounds", type=int, default=None, help="draft-simple (default 4)")
    p.add_argument("--tokens", type=int, default=None, help="max_tokens (default 128)")
    p.add_argument("--quick", action="store_true", help="one round each, 16 tokens, fewer arms")
    p.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    p.add_argument(
        "--table", type=Path, default=None, help="print a saved report's docs table and exit"
    )
    return p


def plan_of(args: argparse.Namespace) -> Plan:
    if not args.llama_server:
        _parser().error(f"no llama-server: --llama-server or ${BINARY_ENV} (the patched build)")
    model = args.model or _default_model()
    fields: dict[str, Any] = {"spec_type": args.spec_type, "depths": args.depths}
    if args.quick:
        fields.update(QUICK)
    for key in ("rounds", "concurrent_rounds", "control_rounds", "tokens"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    return Plan(str(args.llama_server), model, **fields)


def _default_model() -> Path:
    if os.environ.get(MODEL_ENV):
        return Path(os.environ[MODEL_ENV])
    from tests.support.real_models import GEMMA3_270M, cache_dir, pinned_models

    return cache_dir() / pinned_models()[GEMMA3_270M].file


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.table is not None:
        print(markdown_table(json.loads(args.table.read_text())))
        return 0
    plan = plan_of(args)
    if not plan.model.is_file():
        _parser().error(f"no model file {plan.model} (scripts/fetch-models.sh gemma3-270m)")
    with ended_by_signals(), tempfile.TemporaryDirectory(prefix="bench-real-routing-") as tmp:
        report = run(plan, Path(tmp))
    print(render(report))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

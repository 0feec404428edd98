"""The routing benchmark's reference policies: what a router could have done on the same trace.

``hindsight``: the best draft setting *in hindsight* per request class and load
level. Every static setting is replayed over the trace first; each request is put in its cell:
the proxy's request class (e.g. ``16k-64k/code``) and its load level (the requests outstanding
at its send, itself included: 1, 2-3 or 4+, the proxy's default ``routing.concurrency_levels``).
Per cell the static setting with the highest goodput (output tokens / seconds waited) wins, if
it beats the best static setting overall there by >= 3 % with >= 3 requests in each of the two
runs (a cell of one or two requests is noise, and a deviation changes the queue and caches every
other cell sees); otherwise the cell keeps the best static setting overall. Then the trace is
replayed once more with every request pinned (X-MTP-Profile) to its cell's setting, its load
level counted live. It is a deterministic function of the static runs, so repeat runs
agree as closely as the static runs do.

What it bounds: any policy that decides from the request class and the load level alone (the
adaptive policy's information; it learns per class and load) and keeps to one setting per cell,
up to the interaction between cells (a cell's choice changes how long its requests hold the
server, so the load and queueing other cells see) and up to run-to-run noise. What it does not
bound: a policy that uses finer information (a session's own acceptance, the exact context, what
will arrive next), that mixes settings within a cell, or that trades one request's speed for
others' (e.g. drafting less at load 2 to help the request beside it). On a pool (one process per
setting) it also ignores where a session's cache is: a pinned session whose cell changes moves
to another backend and re-prefills. So a policy can beat it; where one does, that is a finding
about the cells, not a bug. bench.routing's oracle is the best of this, greedy and the static
rows (bench/routing_report.py).

``greedy``: per request, the setting the simulator predicts fastest for it, evaluated against
the same cache and load state at its send (POST /sim/predict on each backend, or on the one
backend with each depth as ``draft``). It never gives up one request's speed for a later one's
(it does not place a session for what it will become, nor spare the requests beside it), so it
is a per-request counterfactual, not an upper bound.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.routing_replay import Outcome
from bench.routing_report import PolicyRun
from proxy.apis import API_OF_PATH
from proxy.workloads.trace import PATHS, TraceRequest

MIN_CELL_REQUESTS = 3  # a cell leaves the best overall setting only on this many requests ...
MIN_CELL_GAIN = 0.03  # ... and by this much goodput in that cell
LOAD_LEVELS = (1, 2, 4)  # 1, 2-3, 4+: the levels the proxy's statistics are keyed by by default
SIM_API = {
    path: "completion" if API_OF_PATH[path] == "completions" else API_OF_PATH[path]
    for path in PATHS
}
"""The simulator's name of each path's API (its /sim/predict takes it as "api")."""


def load_level(load: int) -> str:
    i = max(bisect.bisect_right(LOAD_LEVELS, load) - 1, 0)
    if i == len(LOAD_LEVELS) - 1:
        return f"{LOAD_LEVELS[i]}+"
    low, high = LOAD_LEVELS[i], LOAD_LEVELS[i + 1] - 1
    return str(low) if low == high else f"{low}-{high}"


Cell = tuple[str, str]  # (request class, load level)


@dataclass(frozen=True)
class CellStats:
    requests: int
    output_tokens: int
    waited_s: float  # simulated seconds

    @property
    def goodput(self) -> float:
        return self.output_tokens / self.waited_s if self.waited_s > 0 else 0.0


@dataclass(frozen=True)
class Hindsight:
    """Per cell, the static profile with the best goodput in the static runs."""

    table: dict[Cell, str]
    fallback: str  # the best static profile overall: for cells no static run saw
    cells: dict[Cell, dict[str, CellStats]]  # cell -> profile -> its figures in that run

    def choose(self, request_class: str, load: int) -> str:
        return self.table.get((request_class, load_level(load)), self.fallback)


def cell_stats(run: PolicyRun, classes: dict[int, str]) -> dict[Cell, CellStats]:
    acc: dict[Cell, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for o in run.outcomes:
        cell = (classes.get(o.index, "?"), load_level(o.load))
        acc[cell][0] += 1
        acc[cell][1] += o.output_tokens
        acc[cell][2] += o.latency * run.time_scale
    return {c: CellStats(int(n), int(t), w) for c, (n, t, w) in acc.items()}


def hindsight(static_runs: dict[str, PolicyRun], classes: dict[int, str]) -> Hindsight:
    """static_runs: profile -> its static run (every request pinned to it)."""
    per_profile = {p: cell_stats(run, classes) for p, run in static_runs.items()}
    cells: dict[Cell, dict[str, CellStats]] = defaultdict(dict)
    for profile, stats in per_profile.items():
        for cell, s in stats.items():
            cells[cell][profile] = s
    order = list(static_runs)  # ties go to the first profile listed (off before min before max)
    overall = {p: run.summary()["goodput_tok_s"] for p, run in static_runs.items()}
    fallback = max(order, key=lambda p: (overall[p], -order.index(p)))
    table = {cell: _pick(by, fallback, order) for cell, by in cells.items()}
    return Hindsight(table, fallback, dict(sorted(cells.items())))


def _pick(by: dict[str, CellStats], fallback: str, order: list[str]) -> str:
    """The cell's best static, where it is clearly better than the overall best's there."""
    best = max(by, key=lambda p: (by[p].goodput, -order.index(p)))
    base = by.get(fallback)
    if base is None:
        return best
    enough = min(by[best].requests, base.requests) >= MIN_CELL_REQUESTS
    return best if enough and by[best].goodput >= (1 + MIN_CELL_GAIN) * base.goodput else fallback


SHORT_OUTPUT_TOKENS = 400
"""The output-length split of ``choice_estimates``: answers under ~400 tokens, where an RTX 4090
run lost 9 % to drafting (docs/published-figures.md#rtx-3090-at-250-w)."""


def choice_estimates(static_runs: dict[str, PolicyRun], classes: dict[int, str]) -> dict[str, Any]:
    """What a perfect choice could reach, estimated from the static runs alone (each request
    takes the latency it had in the run of the setting chosen for it; the interactions between
    requests are ignored), as ratios to the best static run:

    - ``per_request``: every request at the setting that served it fastest;
    - ``per_class``: per request class and load level, the setting with the best goodput there;
    - ``per_class_and_output``: the same, the class also split by output length (under or over
      ``SHORT_OUTPUT_TOKENS``; known here in hindsight). Where it is no higher than
      ``per_class``, the output length would not pay as a feature of the class."""
    by_index = {
        p: {o.index: o for o in run.outcomes} for p, run in static_runs.items() if run.outcomes
    }
    if not by_index:
        return {}
    common = set.intersection(*(set(outcomes) for outcomes in by_index.values()))
    scale = next(iter(static_runs.values())).time_scale

    def goodput(pick: dict[int, str]) -> float:
        tokens = sum(by_index[pick[i]][i].output_tokens for i in common)
        waited = sum(by_index[pick[i]][i].latency for i in common) * scale
        return tokens / waited if waited > 0 else 0.0

    def per_cell(key: Any) -> dict[int, str]:
        cells: dict[Any, list[int]] = defaultdict(list)
        for i in common:
            cells[key(i)].append(i)
        pick: dict[int, str] = {}
        for members in cells.values():
            best = max(by_index, key=lambda p: _cell_goodput(by_index[p], members, scale))
            pick.update(dict.fromkeys(members, best))
        return pick

    static = {p: goodput(dict.fromkeys(common, p)) for p in by_index}
    base = max(static.values())
    cell = {i: (classes.get(i, "?"), load_level(_any(by_index, i).load)) for i in common}

    def short(i: int) -> bool:
        return _any(by_index, i).output_tokens < SHORT_OUTPUT_TOKENS

    fastest = {i: min(by_index, key=lambda p: by_index[p][i].latency) for i in common}
    estimates = {
        "per_request": goodput(fastest),
        "per_class": goodput(per_cell(lambda i: cell[i])),
        "per_class_and_output": goodput(per_cell(lambda i: (*cell[i], short(i)))),
    }
    out: dict[str, Any] = {k: round(v / base, 4) for k, v in estimates.items()}
    out["requests"] = len(common)
    out["short_outputs"] = sum(short(i) for i in common)
    if "off" in by_index:
        gaps = {p: class_gap(by_index[p], by_index["off"], common, classes) for p in by_index}
        out["class_gap_vs_off"] = {p: round(g, 3) for p, g in gaps.items() if p != "off"}
    return out


def class_gap(
    outcomes: dict[int, Outcome],
    reference: dict[int, Outcome],
    common: set[int],
    classes: dict[int, str],
) -> float:
    """The log decode-speed gap of ``outcomes`` against ``reference`` as the proxy's busy
    comparison weighs one (``BusyDepths.gap``): per request class, the difference of its total
    decode speed (the backend's own timings), weighted by its decode time at the two settings.
    Here every class is measured at both, on the same requests under the static runs'
    conditions: whether its sign names the better static row says whether that weighing picks
    the trace's winner once it has the data (docs/benchmarks.md, "Other routing runs",
    busy comparison)."""
    # class -> (decode ms, tokens) summed at the setting, and at the reference
    own: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    ref: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for i in common:
        a, b = outcomes[i], reference[i]
        if a.predicted_ms and b.predicted_ms and a.predicted_n and b.predicted_n:
            label = classes.get(i, "?")
            for totals, outcome in ((own, a), (ref, b)):
                totals[label][0] += outcome.predicted_ms or 0.0
                totals[label][1] += outcome.predicted_n or 0
    weight = sum(own[c][0] + ref[c][0] for c in own)
    if weight <= 0:
        return 0.0

    def speed(totals: list[float]) -> float:
        return totals[1] / totals[0]

    gaps = ((own[c][0] + ref[c][0]) * math.log(speed(own[c]) / speed(ref[c])) for c in own)
    return sum(gaps) / weight


def _any(by_index: dict[str, dict[int, Outcome]], i: int) -> Outcome:
    return next(iter(by_index.values()))[i]


def _cell_goodput(outcomes: dict[int, Outcome], members: list[int], scale: float) -> float:
    waited = sum(outcomes[i].latency for i in members) * scale
    return sum(outcomes[i].output_tokens for i in members) / waited if waited > 0 else 0.0


class HindsightPin:
    """Pins each request to its cell's winner, the load counted as it is sent."""

    def __init__(self, reference: Hindsight, classes: dict[int, str]) -> None:
        self.reference = reference
        self.classes = classes

    async def pin(self, r: TraceRequest, load: int) -> dict[str, str]:
        return {"X-MTP-Profile": self.reference.choose(self.classes.get(r.index, "?"), load)}

    def done(self, r: TraceRequest) -> None:
        pass


class GreedyPin:
    """Pins each request to the choice the simulator predicts fastest for it, at its send.

    ``choices``: profile -> (simulator URL, draft settings to evaluate or None for the server's
    own). On a pool every profile has its own URL and a backend whose slots this pinner's own
    requests fill is skipped (llama-server would queue the request, which /sim/predict does not
    count) unless every one is full; on one process every profile is a depth on the same URL.
    """

    def __init__(self, choices: dict[str, tuple[str, Any]], slots: int) -> None:
        self.choices = choices
        self.slots = slots
        self.shared = len({url for url, _ in choices.values()}) == 1
        self.in_flight = dict.fromkeys(choices, 0)
        self._pinned: dict[int, str] = {}
        self._http: aiohttp.ClientSession | None = None

    async def pin(self, r: TraceRequest, load: int) -> dict[str, str]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        http = self._http
        body = {**r.body, "api": SIM_API[r.path]}
        headers = {"Content-Type": "application/json"}

        async def predict(profile: str) -> float:
            url, draft = self.choices[profile]
            data = json.dumps(body if draft is None else {**body, "draft": draft}).encode()
            async with http.post(url + "/sim/predict", data=data, headers=headers) as resp:
                resp.raise_for_status()
                return float((await resp.json())["total_s"])

        open_ = [p for p in self.choices if self.shared or self.in_flight[p] < self.slots]
        profiles = open_ or list(self.choices)
        totals = await asyncio.gather(*(predict(p) for p in profiles))
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


def cells_report(
    reference: Hindsight, runs: dict[str, PolicyRun], classes: dict[int, str]
) -> list[dict[str, Any]]:
    """Per cell: every static's goodput there, the reference's pick, and how the other policies
    (adaptive, hindsight, greedy) did in the same cell and where they sent its requests."""
    others = {n: r for n, r in runs.items() if n in ("adaptive", "hindsight", "greedy")}
    seen = {n: cell_stats(r, classes) for n, r in others.items()}
    mixes: dict[str, dict[Cell, dict[str, int]]] = {}
    for name, run in others.items():
        mix: dict[Cell, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for o in run.outcomes:
            mix[(classes.get(o.index, "?"), load_level(o.load))][o.profile] += 1
        mixes[name] = mix
    rows = []
    for cell, by in reference.cells.items():
        row: dict[str, Any] = {
            "class": cell[0],
            "load": cell[1],
            "pick": reference.table[cell],
            "static": {p: _cell_json(s) for p, s in by.items()},
        }
        for name in others:
            s = seen[name].get(cell)
            if s is not None:
                row[name] = {**_cell_json(s), "mix": dict(sorted(mixes[name][cell].items()))}
        rows.append(row)
    return rows


def _cell_json(s: CellStats) -> dict[str, Any]:
    return {"requests": s.requests, "goodput_tok_s": round(s.goodput, 3)}


def cells_table(rows: list[dict[str, Any]]) -> str:
    """The cells as text: where adaptive's choice and the reference's differ, and by how much."""
    head = f"{'class':<16} {'load':>4} {'pick':>5}  static goodput (requests)  | adaptive"
    lines = ["per request class and load level (goodput tok/s in that cell):", head]
    for row in rows:
        statics = " ".join(
            f"{p}:{s['goodput_tok_s']:.1f}({s['requests']})" for p, s in row["static"].items()
        )
        a = row.get("adaptive")
        adaptive = (
            "-"
            if a is None
            else f"{a['goodput_tok_s']:.1f}({a['requests']}) "
            + " ".join(f"{p}:{n}" for p, n in a["mix"].items())
        )
        cell = f"{row['class']:<16} {row['load']:>4} {row['pick']:>5}"
        lines.append(f"{cell}  {statics} | {adaptive}")
    return "\n".join(lines)

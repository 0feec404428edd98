"""Summaries of replayed policies, their ratios, the readable table and the optional plot.

Goodput = output tokens / seconds the client waited for them (sum over requests, send to last
byte), in simulated seconds (wall x time scale) so runs at different time scales compare.
Decode tok/s comes from the backends' own timings (answers without timings are left out).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.routing_replay import Outcome

STATIC_PREFIX = "static:"
TARGET_VS_ORACLE = 0.97  # the routing's targets: adaptive >= 0.97 x the oracle ...
TARGET_GAIN_SHARE = 0.80  # ... and >= 80 % of the oracle's gain over the best static setting
TARGET_GAIN_FLOOR = 0.03  # ... where that gain is >= 3 %


@dataclass
class PolicyRun:
    policy: str
    time_scale: float
    outcomes: list[Outcome]
    errors: list[str]
    wall_s: float
    classes: dict[int, str] = field(default_factory=dict)  # request index -> proxy's class
    events: list[dict[str, Any]] = field(default_factory=list)
    """The proxy's log lines about learning (class_changed, acceptance_*) and the requests, in
    the order written (request lines carry request_id: the trace index in hex)."""

    def summary(self) -> dict[str, Any]:
        out = sum(o.output_tokens for o in self.outcomes)
        latencies = sorted(o.latency * self.time_scale for o in self.outcomes)
        waited = sum(latencies)
        timed = [o for o in self.outcomes if o.predicted_n and o.predicted_ms]
        decode_ms = sum(o.predicted_ms or 0.0 for o in timed)
        mix = Counter(o.profile for o in self.outcomes)
        reasons = Counter(o.reason for o in self.outcomes)
        return {
            "requests": len(self.outcomes),
            "errors": len(self.errors),
            "output_tokens": out,
            "goodput_tok_s": out / waited if waited > 0 else 0.0,
            "decode_tok_s": (
                1e3 * sum(o.predicted_n or 0 for o in timed) / decode_ms if decode_ms else 0.0
            ),
            "latency_mean_s": waited / len(latencies) if latencies else math.nan,
            "latency_p95_s": _percentile(latencies, 0.95),
            "wall_s": round(self.wall_s, 2),
            "mix": dict(sorted(mix.items())),
            "reasons": dict(sorted(reasons.items())),  # X-MTP-Route-Reason
        }


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


REFERENCE_ROWS = ("hindsight", "greedy")  # bench/routing_reference.py


def ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """adaptive_vs_oracle, adaptive_vs_best_static, rules_vs_best_static, the oracle's gain, the
    pool reference row against the best static, and whether adaptive meets the targets.

    The oracle is the best of the reference rows run (the hindsight table, the greedy per-request
    counterfactual) and of the static rows: every static setting is itself an assignment of
    settings to classes and load levels, so the reference is never below the best of them, and
    ``oracle`` names the row it was."""
    goodput = {name: float(s["goodput_tok_s"]) for name, s in summaries.items()}
    statics = {n: g for n, g in goodput.items() if n.startswith(STATIC_PREFIX)}
    out: dict[str, Any] = {}
    if statics:
        best = max(statics, key=lambda n: statics[n])
        out["best_static"] = best
        base = statics[best]
    else:
        base = math.nan
    candidates = {n: goodput[n] for n in (*REFERENCE_ROWS, *statics) if n in goodput}
    oracle = math.nan
    if any(n in goodput for n in REFERENCE_ROWS):
        out["oracle"] = max(candidates, key=lambda n: candidates[n])
        oracle = candidates[out["oracle"]]
        out["oracle_tok_s"] = round(oracle, 3)

    def ratio(a: str, b: float) -> float | None:
        return round(goodput[a] / b, 4) if a in goodput and b > 0 else None

    out["adaptive_vs_oracle"] = ratio("adaptive", oracle)
    out["adaptive_vs_best_static"] = ratio("adaptive", base)
    out["rules_vs_best_static"] = ratio("rules", base)
    out["oracle_vs_best_static"] = round(oracle / base, 4) if oracle > 0 and base > 0 else None
    if "adaptive" in goodput and oracle > 0 and statics:
        gain = oracle - base
        captured = (goodput["adaptive"] - base) / gain if gain > 0 else None
        out["gain_captured"] = None if captured is None else round(captured, 4)
    out["hindsight_vs_oracle"] = ratio("hindsight", oracle)
    out["greedy_vs_oracle"] = ratio("greedy", oracle)
    out["pool_vs_best_static"] = ratio("pool", base)
    out["meets_targets"] = meets_targets(out)
    return out


def meets_targets(r: dict[str, Any]) -> bool | None:
    """adaptive >= 0.97 x oracle, and where the oracle gains >= 3 % over the best static
    setting, adaptive captures >= 80 % of that gain. None when a ratio is missing."""
    vs_oracle, oracle_gain = r.get("adaptive_vs_oracle"), r.get("oracle_vs_best_static")
    if vs_oracle is None or oracle_gain is None:
        return None
    if vs_oracle < TARGET_VS_ORACLE:
        return False
    if oracle_gain - 1.0 < TARGET_GAIN_FLOOR:
        return True
    return (r.get("gain_captured") or 0.0) >= TARGET_GAIN_SHARE


def table(preset: str, summaries: dict[str, dict[str, Any]], rat: dict[str, Any]) -> str:
    head = (
        f"{'policy':<12} {'goodput':>8} {'decode':>8} {'lat mean':>9} {'lat p95':>9} "
        f"{'req':>4} {'err':>3}  profiles"
    )
    lines = [f"preset {preset} (tok/s; latency in simulated s)", head, "-" * len(head)]
    for name, s in summaries.items():
        mix = " ".join(f"{p}:{n}" for p, n in s["mix"].items())
        lines.append(
            f"{name:<12} {s['goodput_tok_s']:8.2f} {s['decode_tok_s']:8.2f} "
            f"{s['latency_mean_s']:9.1f} {s['latency_p95_s']:9.1f} {s['requests']:4d} "
            f"{s['errors']:3d}  {mix}"
        )
    return "\n".join([*lines, *_ratio_lines(rat)])


def _ratio_lines(rat: dict[str, Any]) -> list[str]:
    shown = {k: v for k, v in rat.items() if v is not None and k != "meets_targets"}
    shown.pop("oracle_tok_s", None)
    lines = [
        "  ".join(f"{k} {v}" for k, v in shown.items())
        or "(no ratios: adaptive, oracle or static missing)"
    ]
    if rat.get("meets_targets") is not None:
        lines.append(f"targets met: {'yes' if rat['meets_targets'] else 'NO'}")
    return lines


def mean_report(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per preset, over runs (each ``{preset: {"policies": {policy: summary}, ...}}``, of one
    trace or several): how many runs, each policy's mean goodput, and the ratios of those means.

    Ratios of the means, not means of each run's ratios: the oracle is a max over noisy rows, and
    taking it run by run would pick whichever row was lucky in that run (an oracle biased upwards
    by the noise); on the means it is the row that is best on average. Only policies present in
    every run are averaged."""
    out: dict[str, dict[str, Any]] = {}
    for preset in runs[0]:
        entries = [run[preset]["policies"] for run in runs if preset in run]
        names = [p for p in entries[0] if all(p in e for e in entries)]
        goodput = {p: sum(e[p]["goodput_tok_s"] for e in entries) / len(entries) for p in names}
        out[preset] = {
            "runs": len(entries),
            "goodput_tok_s": goodput,
            "ratios": ratios({p: {"goodput_tok_s": g} for p, g in goodput.items()}),
        }
    return out


def mean_table(title: str, mean: dict[str, dict[str, Any]]) -> str:
    """The mean over runs, per preset: each policy's mean goodput, then the ratios of the means."""
    lines: list[str] = []
    for preset, entry in mean.items():
        lines.append(f"mean of {entry['runs']} runs, {preset}, {title} (goodput, tok/s)")
        lines += [f"  {name:<12} {g:8.2f}" for name, g in entry["goodput_tok_s"].items()]
        lines += _ratio_lines(entry["ratios"])
    return "\n".join(lines)


def plot(path: Path, runs: dict[str, dict[str, PolicyRun]]) -> None:
    """Goodput per policy, and the profile per request class over time (adaptive, hindsight)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = {"off": "tab:blue", "min": "tab:orange", "max": "tab:green"}
    fig, axes = plt.subplots(len(runs), 3, figsize=(18, 4.5 * len(runs)), squeeze=False)
    for row, (preset, by_policy) in enumerate(runs.items()):
        names = list(by_policy)
        values = [by_policy[n].summary()["goodput_tok_s"] for n in names]
        ax = axes[row][0]
        ax.bar(names, values, color="tab:gray")
        ax.set_title(f"{preset}: goodput (tok/s, simulated)")
        ax.tick_params(axis="x", rotation=30)
        for col, name in ((1, "adaptive"), (2, "hindsight")):
            ax = axes[row][col]
            run = by_policy.get(name)
            if run is None:
                ax.set_visible(False)
                continue
            labels = sorted({run.classes.get(o.index, "?") for o in run.outcomes})
            for o in run.outcomes:
                y = labels.index(run.classes.get(o.index, "?"))
                ax.scatter(o.sent * run.time_scale, y, color=colors.get(o.profile, "k"), s=14)
            ax.set_yticks(range(len(labels)), labels)
            ax.set_xlabel("simulated seconds")
            ax.set_title(f"{preset}: {name}, profile per request class")
        handles = [Line2D([], [], marker="o", ls="", color=c, label=p) for p, c in colors.items()]
        axes[row][2].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)

"""The real-engine routing benchmark's report: pure functions from measured requests to tables.

Speed is goodput, as in bench/routing_report.py: output tokens over the seconds the client
waited for them (send to last byte, prefill and queueing included), summed over the requests of
a trace or of a class; the backend's own decode speed (timings) rides along in the JSON.
``ratio`` is adaptive over the best static arm of the same scenario, the headline.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.real_routing_trace import CLASSES, INTENDED

ADAPTIVE = "adaptive"
STATIC_PREFIX = "static:"
DRAFT_GOAL = 0.95  # the draft-simple control: adaptive >= 0.95x static off
OFF_ARM = STATIC_PREFIX + "off"
SEQUENCE_MARKS = {"off": ".", "min": "m", "max": "M"}


@dataclass(frozen=True)
class Record:
    """One answered request of one arm, as its client saw it and as the proxy logged it."""

    scenario: str
    arm: str
    round: int
    cls: str
    index: int
    output_tokens: int
    latency_s: float
    decode_tok_s: float | None
    profile: str
    reason: str
    load: int
    proxy_class: str | None = None
    acceptance: float | None = None


def goodput(records: Iterable[Record]) -> float | None:
    """Output tokens per second waited; None without a request."""
    rows = list(records)
    waited = sum(r.latency_s for r in rows)
    return sum(r.output_tokens for r in rows) / waited if rows and waited > 0 else None


def decode_speed(records: Iterable[Record]) -> float | None:
    """The backend's decode speed over the requests: output over decode time (harmonic)."""
    timed = [r for r in records if r.decode_tok_s and r.output_tokens]
    seconds = sum(r.output_tokens / (r.decode_tok_s or math.inf) for r in timed)
    return sum(r.output_tokens for r in timed) / seconds if seconds > 0 else None


def best_static(speeds: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The static arm with the highest speed, and that speed."""
    statics = {a: s for a, s in speeds.items() if a.startswith(STATIC_PREFIX) and s is not None}
    if not statics:
        return None, None
    arm = max(statics, key=lambda a: statics[a])
    return arm, statics[arm]


def ratio(value: float | None, base: float | None) -> float | None:
    return round(value / base, 4) if value is not None and base else None


def _row(records: list[Record], arms: Sequence[str]) -> dict[str, Any]:
    """Speed per arm, the best static arm, adaptive's ratio to it, and adaptive's choices."""
    speeds = {a: goodput(r for r in records if r.arm == a) for a in arms}
    best, base = best_static(speeds)
    mine = [r for r in records if r.arm == ADAPTIVE]
    return {
        "tok_s": {a: None if s is None else round(s, 2) for a, s in speeds.items()},
        "decode_tok_s": {a: _round(decode_speed(r for r in records if r.arm == a)) for a in arms},
        "requests": len(mine) or len(records) // max(len(arms), 1),
        "best_static": best,
        "adaptive_vs_best_static": ratio(speeds.get(ADAPTIVE), base),
        "adaptive_profiles": dict(sorted(Counter(r.profile for r in mine).items())),
        "adaptive_reasons": dict(sorted(Counter(r.reason for r in mine).items())),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def scenario_report(records: list[Record], arms: Sequence[str]) -> dict[str, Any]:
    """One scenario: the whole trace, each class, and adaptive's ratio round by round (how much
    the machine's noise moves it)."""
    classes = [c for c in CLASSES if any(r.cls == c for r in records)]
    rounds = sorted({r.round for r in records})
    per_round = [_row([r for r in records if r.round == n], arms) for n in rounds]
    return {
        "trace": _row(records, arms),
        "classes": {c: _row([r for r in records if r.cls == c], arms) for c in classes},
        "round_ratios": [row["adaptive_vs_best_static"] for row in per_round],
        "mean_load": round(sum(r.load for r in records) / len(records), 2) if records else None,
    }


def classifier_report(records: Iterable[Record]) -> dict[str, Any]:
    """Per trace class: the kind it is meant to be, the proxy's classes for it (every arm's
    requests), and the share whose kind matched."""
    out: dict[str, Any] = {}
    rows = [r for r in records if r.proxy_class]
    for cls in CLASSES:
        mine = [r for r in rows if r.cls == cls]
        if not mine:
            continue
        found = Counter(str(r.proxy_class) for r in mine)
        matched = sum(n for label, n in found.items() if label.endswith("/" + INTENDED[cls]))
        out[cls] = {
            "intended": INTENDED[cls],
            "proxy_classes": dict(sorted(found.items())),
            "matched": round(matched / len(mine), 3),
        }
    return out


def drafted_after(profiles: Sequence[str], off: str = "off") -> int | None:
    """How many requests it took until drafting stopped for good: the position of the last
    drafting request (0: never drafted); None when the last request still drafted."""
    if profiles and profiles[-1] != off:
        return None
    drafting = [i for i, p in enumerate(profiles, start=1) if p != off]
    return drafting[-1] if drafting else 0


def draft_control_report(records: list[Record], arms: Sequence[str]) -> dict[str, Any]:
    """The draft-simple control (the target as its own draft: drafting cannot pay): adaptive
    against static off, and when adaptive stopped drafting."""
    row = _row(records, arms)
    off = row["tok_s"].get(OFF_ARM)
    mine = sorted((r for r in records if r.arm == ADAPTIVE), key=lambda r: r.index)
    profiles = [r.profile for r in mine]
    vs_off = ratio(row["tok_s"].get(ADAPTIVE), off)
    return {
        **row,
        "adaptive_vs_off": vs_off,
        "goal": DRAFT_GOAL,
        "meets_goal": None if vs_off is None else vs_off >= DRAFT_GOAL,
        "adaptive_sequence": profiles,
        "stopped_drafting_after": drafted_after(profiles),
    }


def headline(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per trace: adaptive, the best static arm and the ratio (the draft control: against off)."""
    rows = []
    for name, scen in report.get("scenarios", {}).items():
        trace = scen["trace"]
        best = trace["best_static"]
        rows.append(
            {
                "trace": name,
                "against": "best static",
                "adaptive_tok_s": trace["tok_s"].get(ADAPTIVE),
                "best_static": best,
                "best_static_tok_s": trace["tok_s"].get(best) if best else None,
                "adaptive_vs_best_static": trace["adaptive_vs_best_static"],
            }
        )
    control = report.get("draft_control")
    if control:
        rows.append(
            {
                "trace": "draft-simple control",
                "against": "static",
                "adaptive_tok_s": control["tok_s"].get(ADAPTIVE),
                "best_static": OFF_ARM,
                "best_static_tok_s": control["tok_s"].get(OFF_ARM),
                "adaptive_vs_best_static": control["adaptive_vs_off"],
            }
        )
    return rows


def records_json(records: Iterable[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]


# --- text -------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def arm_label(arm: str, depths: dict[str, int]) -> str:
    """static:min -> 'min=8'; adaptive stays."""
    profile = arm.removeprefix(STATIC_PREFIX)
    return f"{profile}={depths[profile]}" if arm != profile and profile in depths else arm


def headline_text(rows: list[dict[str, Any]], depths: dict[str, int]) -> str:
    lines = ["HEADLINE: adaptive / best static, per trace (goodput, output tok/s waited for)"]
    for row in rows:
        best = arm_label(row["best_static"], depths) if row["best_static"] else "-"
        lines.append(
            f"  {row['trace']:<22} adaptive {_num(row['adaptive_tok_s'], 2):>7}   "
            f"{row['against']:>11} {best:<7} {_num(row['best_static_tok_s'], 2):>7}   "
            f"{_x(row['adaptive_vs_best_static'])}"
        )
    return "\n".join(lines)


def scenario_text(
    name: str, scen: dict[str, Any], arms: Sequence[str], depths: dict[str, int]
) -> str:
    labels = [arm_label(a, depths) for a in arms]
    head = f"{'class':<7}" + "".join(f"{lb:>10}" for lb in labels)
    head += f"  {'best':<10} {'ratio':>7}  adaptive's profiles (reasons)"
    lines = [f"{name}: goodput tok/s per class (mean load {scen['mean_load']})", head]
    for cls, row in [*scen["classes"].items(), ("TRACE", scen["trace"])]:
        speeds = "".join(f"{_num(row['tok_s'].get(a)):>10}" for a in arms)
        best = arm_label(row["best_static"], depths) if row["best_static"] else "-"
        mix = " ".join(f"{p}:{n}" for p, n in row["adaptive_profiles"].items())
        why = " ".join(f"{p}:{n}" for p, n in row["adaptive_reasons"].items())
        lines.append(
            f"{cls:<7}{speeds}  {best:<10} {_x(row['adaptive_vs_best_static']):>7}  {mix} ({why})"
        )
    ratios = ", ".join(_x(r) for r in scen["round_ratios"])
    lines.append(f"adaptive / best static round by round: {ratios}")
    return "\n".join(lines)


def classifier_text(found: dict[str, Any]) -> str:
    lines = ["classifier: the proxy's class per trace class (all arms' requests)"]
    for cls, row in found.items():
        classes = ", ".join(f"{label} x{n}" for label, n in row["proxy_classes"].items())
        lines.append(f"  {cls:<6} meant {row['intended']:<6} {row['matched']:>6.0%}  {classes}")
    return "\n".join(lines)


def calibration_text(verdicts: dict[str, Any]) -> str:
    lines = ["start-up calibration (deepest depth / depth 0 per level -> cold rule)"]
    for arm, found in verdicts.items():
        if not found:
            lines.append(f"  {arm}: none (not measured)")
            continue
        for backend, c in found.items():
            parts = []
            for level, v in sorted(c.get("levels", {}).items()):
                kinds = ", ".join(f"{k} {r:.2f}x" for k, r in sorted(v.get("by_kind", {}).items()))
                gap = _x(v.get("deep_vs_off"))
                parts.append(
                    f"@{level} {gap} -> {v.get('cold_role')}" + (f" ({kinds})" if kinds else "")
                )
            lines.append(f"  {arm} ({backend}): " + "; ".join(parts))
    return "\n".join(lines)


def control_text(control: dict[str, Any], arms: Sequence[str], depths: dict[str, int]) -> str:
    speeds = ", ".join(f"{arm_label(a, depths)} {_num(control['tok_s'].get(a), 2)}" for a in arms)
    sequence = "".join(SEQUENCE_MARKS.get(p, "?") for p in control["adaptive_sequence"])
    after = control["stopped_drafting_after"]
    stopped = {None: "still drafting at the end", 0: "never drafted"}.get(
        after, f"drafted for the last time at request {after}"
    )
    verdict = {True: "met", False: "NOT met", None: "-"}[control["meets_goal"]]
    return "\n".join(
        [
            f"draft-simple control (the target as its own draft): {speeds} tok/s",
            f"  adaptive / static off {_x(control['adaptive_vs_off'])} (goal >= {control['goal']}x:"
            f" {verdict}); {stopped}",
            f"  adaptive's profile per request (. off, m min, M max): {sequence}",
        ]
    )


def render(report: dict[str, Any]) -> str:
    depths = report["depths"]
    parts = [headline_text(report["headline"], depths)]
    for name, scen in report["scenarios"].items():
        parts.append(scenario_text(f"{name} ({report['spec_type']})", scen, report["arms"], depths))
    if report.get("draft_control"):
        parts.append(control_text(report["draft_control"], report["control_arms"], depths))
    parts.append(calibration_text(report["calibration"]))
    parts.append(classifier_text(report["classifier"]))
    if report.get("errors"):
        parts.append("ERRORS:\n" + "\n".join(f"  {e}" for e in report["errors"]))
    return "\n\n".join(parts)


def markdown_table(report: dict[str, Any]) -> str:
    """The docs' table: per scenario and class, goodput per arm, the best static arm and
    adaptive's ratio to it, its profiles; then the draft-simple control's row."""
    depths, arms = report["depths"], report["arms"]
    labels = [arm_label(a, depths) for a in arms]
    lines = [
        "| scenario | class | " + " | ".join(labels) + " | best | adaptive / best | adaptive ran |",
        "|---" * (len(arms) + 5) + "|",
    ]
    for name, scen in report["scenarios"].items():
        for cls, row in [*scen["classes"].items(), ("**trace**", scen["trace"])]:
            speeds = " | ".join(_num(row["tok_s"].get(a)) for a in arms)
            best = arm_label(row["best_static"], depths) if row["best_static"] else "-"
            mix = ", ".join(f"{p} {n}" for p, n in row["adaptive_profiles"].items())
            lines.append(
                f"| {name} | {cls} | {speeds} | {best} | {_x(row['adaptive_vs_best_static'])} "
                f"| {mix} |"
            )
    control = report.get("draft_control")
    if control:
        after = control["stopped_drafting_after"]
        lines.append(
            f"\ndraft-simple control: static off {_num(control['tok_s'].get(OFF_ARM))}, adaptive "
            f"{_num(control['tok_s'].get(ADAPTIVE))} tok/s, {_x(control['adaptive_vs_off'])}; "
            + ("still drafting at the end" if after is None else f"last drafted at request {after}")
        )
    return "\n".join(lines)

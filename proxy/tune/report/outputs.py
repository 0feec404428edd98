"""What a tune run leaves behind: the table (printed, CSV, JSON), profiles.toml, the learned file.

OUT/results.csv      one row per setting x class
OUT/results.json     {"run": ..., "rows": [...], "left_out": [...], "no_data": [...],
                      "failures": [...], "busy": ...}: the rows and what the run could not measure
OUT/profiles.toml    the recommended [[models.profiles]], reasons as comments
OUT/routing-state.json  routing.learned_file pre-seeded with the measurements
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.routing.stats import LearnedStats, write_atomic
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.report.analysis import Cell, Spread, Table
from proxy.tune.report.labels import class_words
from proxy.tune.report.recommend import Recommendation

_CSV_FIELDS = (
    "class", "class_words", "setting", "setting_words", "spec_type", "draft_n_max",
    "draft_n_min", "draft_p_min", "tok_s", "tok_s_lo", "tok_s_hi", "speedup", "speedup_lo",
    "speedup_hi", "acceptance", "acceptance_lo", "acceptance_hi", "prefill_s", "goodput",
    "goodput_lo", "goodput_hi", "repeats", "requests", "level", "mode", "verdict",
)  # fmt: skip


@dataclass
class RunReport:
    """What the summary, results.json and profiles.toml say besides the table."""

    model: str
    workload: str
    requests: int  # measured requests the table is made of
    repeats_asked: int
    repeats_measured: int
    when: str
    left_out: dict[str, str] = field(default_factory=dict)  # class -> why it does not fit
    no_data: dict[str, str] = field(default_factory=dict)  # planned class -> why it has none
    failures: list[dict[str, Any]] = field(default_factory=list)
    busy: str | None = None  # the box was busy: what that means for the figures
    unmeasurable: dict[str, str] = field(default_factory=dict)  # setting -> why
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "workload": self.workload,
            "requests": self.requests,
            "repeats": {"asked": self.repeats_asked, "measured": self.repeats_measured},
            "when": self.when,
            "interrupted": self.interrupted,
            "busy": self.busy,
        }

    def header(self) -> str:
        repeats = f"{self.repeats_measured} of {self.repeats_asked} repeats"
        if self.repeats_measured == self.repeats_asked:
            repeats = f"{self.repeats_asked} repeats"
        cut = ", interrupted" if self.interrupted else ""
        return f"{self.requests} requests ({self.workload} workload), {repeats}{cut}, {self.when}."


def setting_json(setting: DraftSetting) -> str | dict[str, Any]:
    """ "off", or the profile fields (None: left to llama-server's default)."""
    if setting.is_off:
        return "off"
    return {
        "spec_type": setting.spec_type,
        "draft_n_max": setting.n_max,
        "draft_n_min": setting.n_min,
        "draft_p_min": setting.p_min,
    }


def verdict(cell: Cell, table: Table) -> str:
    """best / faster than off / slower than off / within the spread of off; with one repeat
    there is no spread, and the verdict says so instead of comparing two single values."""
    cells = table.of_class(cell.label)
    best = max(cells, key=lambda c: c.tok_s.median)
    off = next((c for c in cells if c.setting.is_off), None)
    words = []
    if cell is best:
        words.append("best")
    if off is not None and cell is not off:
        if min(cell.repeats, off.repeats) < 2:
            words.append("one repeat: no spread")
        elif cell.better_than(off):
            words.append("faster than off")
        elif off.better_than(cell):
            words.append("slower than off")
        else:
            words.append("within spread of off")
    return ", ".join(words)


def rows(table: Table) -> list[dict[str, Any]]:
    out = []
    for label in table.classes():
        for cell in sorted(table.of_class(label), key=lambda c: _setting_order(c.setting)):
            out.append(
                {
                    "setting": setting_json(cell.setting),
                    "setting_name": cell.setting.name,
                    "setting_words": cell.setting.label,
                    "class": label,
                    "class_words": class_words(label),
                    "tok_s": round(cell.tok_s.median, 2),
                    "acceptance": _median(cell.acceptance, 4),
                    "speedup": _median(cell.speedup, 4),
                    "spread": {
                        "tok_s": cell.tok_s.to_json(2),
                        "acceptance": _spread(cell.acceptance, 4),
                        "speedup": _spread(cell.speedup, 4),
                        "goodput": _spread(cell.goodput, 2),
                    },
                    "prefill_s": _median(cell.prefill_s, 3),
                    "goodput": _median(cell.goodput, 2),
                    "repeats": cell.repeats,
                    "requests": cell.requests,
                    "level": cell.level,
                    "mode": cell.mode,
                    "verdict": verdict(cell, table),
                }
            )
    return out


def _setting_order(s: DraftSetting) -> tuple[int, int, float]:
    return (s.n_max or 0, -1 if s.n_min is None else s.n_min, -1.0 if s.p_min is None else s.p_min)


def _median(spread: Spread | None, digits: int) -> float | None:
    return None if spread is None else round(spread.median, digits)


def _spread(spread: Spread | None, digits: int) -> dict[str, float] | None:
    return None if spread is None else spread.to_json(digits)


def _named(reasons: dict[str, str]) -> list[dict[str, str]]:
    return [
        {"class": label, "class_words": class_words(label), "reason": why}
        for label, why in sorted(reasons.items())
    ]


def write_results(
    out: Path, table_rows: list[dict[str, Any]], report: RunReport, rec: Recommendation
) -> None:
    document = {
        "run": {**report.to_json(), "provisional": rec.provisional},
        "rows": table_rows,
        "left_out": _named(report.left_out),
        "no_data": _named(report.no_data),
        "failures": report.failures,
        "not_measurable": [
            {"setting": name, "reason": why} for name, why in sorted(report.unmeasurable.items())
        ],
        "recommended": [p.name for p in rec.profiles],
        "roles": rec.roles(),
    }
    write_atomic(out / "results.json", (json.dumps(document, indent=2) + "\n").encode())
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in table_rows:
        setting = row["setting"]
        fields = setting if isinstance(setting, dict) else {}
        spread = row["spread"]
        writer.writerow(
            {
                "class": row["class"],
                "class_words": row["class_words"],
                "setting": row["setting_name"],
                "setting_words": row["setting_words"],
                **{
                    k: fields.get(k)
                    for k in ("spec_type", "draft_n_max", "draft_n_min", "draft_p_min")
                },
                "tok_s": row["tok_s"],
                "tok_s_lo": spread["tok_s"]["lo"],
                "tok_s_hi": spread["tok_s"]["hi"],
                **_csv_spread("speedup", row["speedup"], spread["speedup"]),
                **_csv_spread("acceptance", row["acceptance"], spread["acceptance"]),
                "prefill_s": row["prefill_s"],
                **_csv_spread("goodput", row["goodput"], spread["goodput"]),
                "repeats": row["repeats"],
                "requests": row["requests"],
                "level": row["level"],
                "mode": row["mode"],
                "verdict": row["verdict"],
            }
        )
    write_atomic(out / "results.csv", buf.getvalue().encode())


def _csv_spread(name: str, median: float | None, spread: dict[str, float] | None) -> dict[str, Any]:
    return {
        name: median,
        f"{name}_lo": None if spread is None else spread["lo"],
        f"{name}_hi": None if spread is None else spread["hi"],
    }


def render_table(table_rows: list[dict[str, Any]]) -> str:
    """The table as text: per class (in words), each setting's tok/s with its spread, the paired
    speedup over off, acceptance, prefill and the verdict."""
    header = f"{'setting':<28} {'tok/s':>8} {'(spread)':>15} {'speedup':>8} " \
        f"{'accept':>7} {'prefill s':>9}  verdict"  # fmt: skip
    lines = [header, "-" * len(header)]
    last = None
    for row in table_rows:
        if row["class"] != last:
            if last is not None:
                lines.append("")
            lines.append(f"{row['class_words']} ({row['class']})")
        last = row["class"]
        spread = row["spread"]["tok_s"]
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-"
        accept = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else "-"
        prefill = f"{row['prefill_s']:.2f}" if row["prefill_s"] is not None else "-"
        lines.append(
            f"  {row['setting_words']:<26} {row['tok_s']:>8.1f} "
            f"{'(' + format(spread['lo'], '.1f') + '-' + format(spread['hi'], '.1f') + ')':>15} "
            f"{speedup:>8} {accept:>7} {prefill:>9}  {row['verdict']}"
        )
    lines.append("")
    lines.append(
        "tok/s: median decode speed over the repeats (spread: slowest-fastest repeat); speedup: "
        "over off, paired (each repeat on the requests both answered), median of the repeats."
    )
    return "\n".join(lines)


def profiles_toml(rec: Recommendation, report: RunReport) -> str:
    """The recommended [[models.profiles]] block; every choice explained in comments."""
    lines = [
        f"# Recommended draft settings for model {report.model!r}, measured by `mtp-proxy tune`.",
        f"# {report.header()}",
    ]
    if rec.provisional:
        lines += [
            f"# PROVISIONAL: {rec.provisional}. Nothing is recommended over off without a",
            "# spread to judge by: rerun with --repeats 2 or more (it resumes what is measured).",
        ]
    lines += [
        "# Profile names say their setting and keep that meaning: off, n3 = n_max 3,",
        "# n3-m1 = n_max 3 / n_min 1, n2-p0.5 = n_max 2 / p_min 0.5. `mtp-proxy tune --apply",
        "# CONFIG` writes them into the model's [[models]] entry with the [routing] roles below.",
        "# Each profile is kept because it is faster than off beyond the spread in a request",
        "# class no other kept profile covers; off stays as the fallback.",
        "#",
        "# [routing] " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in rec.roles().items()),
    ]
    for label, why in sorted(report.left_out.items()):
        lines.append(f"# left out: {class_words(label)} ({label}): {why}")
    for label, why in sorted(report.no_data.items()):
        if label not in report.left_out:
            lines.append(f"# no data: {class_words(label)} ({label}): {why}")
    for name, why in sorted(report.unmeasurable.items()):
        lines.append(f"# not measured: {name}: {why}")
    if report.busy:
        lines.append(f"# busy: {report.busy}")
    for note in rec.notes:
        lines.append(f"# note: {note}")
    for profile in rec.profiles:
        lines += ["", "[[models.profiles]]"]
        lines.append(f"name = {json.dumps(profile.name)}")
        for key, value in profile.setting.profile_fields().items():
            lines.append(f"{key} = {json.dumps(value)}")
        for reason in profile.reasons or ["kept as the fallback"]:
            lines.append(f"# {reason}")
    return "\n".join(lines) + "\n"


def write_recommendation(out: Path, text: str, stats: LearnedStats) -> None:
    write_atomic(out / "profiles.toml", text.encode())
    stats.save(out / "routing-state.json")

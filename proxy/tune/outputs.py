"""What a tune run leaves behind: the table (printed, CSV, JSON), profiles.toml, the state file.

OUT/results.csv, OUT/results.json  one row per setting x class
OUT/profiles.toml                  the recommended [[models.profiles]], reasons as comments
OUT/routing-state.json             routing.state_file pre-seeded with the measurements
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from proxy.routing.stats import LearnedStats, write_atomic
from proxy.tune.analysis import Cell, Spread, Table
from proxy.tune.grid import DraftSetting
from proxy.tune.recommend import Recommendation

_CSV_FIELDS = (
    "class", "setting", "spec_type", "draft_n_max", "draft_n_min", "draft_p_min",
    "tok_s", "tok_s_lo", "tok_s_hi", "speedup", "speedup_lo", "speedup_hi",
    "acceptance", "acceptance_lo", "acceptance_hi", "prefill_s", "goodput", "goodput_lo",
    "goodput_hi", "repeats", "requests", "mode", "verdict",
)  # fmt: skip


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
    """best / faster than off / slower than off / within the spread of off."""
    cells = table.of_class(cell.label)
    best = max(cells, key=lambda c: c.tok_s.median)
    off = next((c for c in cells if c.setting.is_off), None)
    words = []
    if cell is best:
        words.append("best")
    if off is not None and cell is not off:
        if cell.better_than(off):
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
                    "class": label,
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


def write_results(out: Path, table_rows: list[dict[str, Any]]) -> None:
    write_atomic(out / "results.json", (json.dumps(table_rows, indent=2) + "\n").encode())
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
                "setting": row["setting_name"],
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
    """The table as text: setting x class with tok/s (spread), speedup, acceptance."""
    header = f"{'class':<14} {'setting':<12} {'tok/s':>8} {'(spread)':>15} {'speedup':>8} " \
        f"{'accept':>7} {'prefill s':>9}  verdict"  # fmt: skip
    lines = [header, "-" * len(header)]
    last = None
    for row in table_rows:
        if last is not None and row["class"] != last:
            lines.append("")
        last = row["class"]
        spread = row["spread"]["tok_s"]
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-"
        accept = f"{row['acceptance']:.0%}" if row["acceptance"] is not None else "-"
        prefill = f"{row['prefill_s']:.2f}" if row["prefill_s"] is not None else "-"
        lines.append(
            f"{row['class']:<14} {row['setting_name']:<12} {row['tok_s']:>8.1f} "
            f"{'(' + format(spread['lo'], '.1f') + '-' + format(spread['hi'], '.1f') + ')':>15} "
            f"{speedup:>8} {accept:>7} {prefill:>9}  {row['verdict']}"
        )
    return "\n".join(lines)


def profiles_toml(rec: Recommendation, model: str, summary: str) -> str:
    """The recommended [[models.profiles]] block; every choice explained in comments."""
    lines = [
        f"# Recommended draft settings for model {model!r}, measured by `mtp-proxy tune`.",
        f"# {summary}",
        "# Replace the profiles of that [[models]] entry with these (add env = {...} as before).",
        "# Each profile is kept because it is at the top (fastest, or within the spread of the",
        "# fastest) of a request class no profile above it covers; off stays as the fallback.",
    ]
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

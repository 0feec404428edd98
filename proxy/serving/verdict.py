"""Does drafting pay on this box: the answer from the first minute, for the live page and
`/admin/drafting`.

Each process serving per-request depths is measured at start-up (proxy.routing.calibrate):
depth 0 and its deepest depth, alone and with every slot decoding. That comparison exists
before any client request; the learned table's only once a class has served off and a depth
at the same load level, which may take hours of ordinary traffic. So per backend and load
level this view gives the calibration's tok/s at both depths, their ratio and a verdict in
words, and beside it every learned comparison of the same load level: off and a depth of the
same class measured at the same load, never a busy off beside an alone depth.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.routing.calibration import Calibration

LearnedRow = Mapping[str, Any]
"""A row of the learned table (``proxy.routing.stats.Statistics.table``)."""


def level_words(level: int, levels: Sequence[int]) -> str:
    """A load level in words: 1 alone; a level up to the next one less one (2-3 decoding);
    the last open (4+ decoding); 0 any load (a pool learns across loads)."""
    if level == 0:
        return "any load (pool)"
    if level <= 1:
        return "alone"
    higher = [other for other in levels if other > level]
    if not higher:
        return f"{level}+ decoding"
    top = higher[0] - 1
    return f"{level} decoding" if top == level else f"{level}-{top} decoding"


def drafting_view(
    calibrations: Mapping[str, Calibration],
    models: Mapping[str, str],
    depths: Mapping[str, Mapping[str, int]],
    learned: Iterable[LearnedRow],
    levels: Sequence[int],
) -> list[dict[str, Any]]:
    """Per backend with a calibration (``models``: backend -> its model; ``depths``: model ->
    profile -> depth): per load level measured, the calibration's speeds, ratio and verdict,
    and the learned same-row comparisons of that level."""
    rows = list(learned)
    out = []
    for backend, calibration in sorted(calibrations.items()):
        model = models.get(backend)
        if model is None:
            continue  # a backend a reload removed
        profiles = depths.get(model, {})
        found = [
            _level(calibration, level, levels, profiles, [r for r in rows if r["model"] == model])
            for level in levels
        ]
        measured, loads = [], set()
        for level in found:  # a level measured at a load a lower level already stands for:
            if level is not None and level["measured_load"] not in loads:  # once is enough
                measured.append(level)
                loads.add(level["measured_load"])
        out.append(
            {
                "backend": backend,
                "model": model,
                "measured_at": calibration.measured_at,
                "slots": calibration.slots,
                "deepest": calibration.deepest,
                "levels": measured,
                "verdict": _summary(calibration.deepest, measured),
            }
        )
    return out


def _level(
    calibration: Calibration,
    level: int,
    levels: Sequence[int],
    profiles: Mapping[str, int],
    learned: Sequence[LearnedRow],
) -> dict[str, Any] | None:
    """One load level: what the calibration measured at the load standing for it."""
    load = calibration.measured_load(level)
    if load is None or calibration.deepest == 0:
        return None
    off, deep = calibration.speed(load, 0), calibration.speed(load, calibration.deepest)
    if off is None or deep is None or off <= 0:
        return None
    ratio = deep / off
    words = level_words(level, levels)
    if load != level:  # a busy level stands for the busy load measured nearest to it
        words += f" (measured with {load} decoding)"
    return {
        "level": level,
        "words": words,
        "measured_load": load,
        "off_tok_s": round(off, 2),
        "deep_tok_s": round(deep, 2),
        "ratio": round(ratio, 3),
        "pays": ratio > 1.0,
        "cold_role": calibration.cold_role(level) or "rules",
        "learned": _same_rows(learned, level, profiles),
    }


def _same_rows(
    learned: Sequence[LearnedRow], level: int, profiles: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The learned comparisons at ``level``: per class, each drafting profile's decode speed over
    off's, both measured at that load level."""
    offs = [p for p, depth in profiles.items() if depth == 0]
    by_class: dict[str, dict[str, LearnedRow]] = {}
    for row in learned:
        if row.get("level") == level and row.get("decode_tok_s"):
            by_class.setdefault(f"{row['bucket']}/{row['kind']}", {})[str(row["profile"])] = row
    out = []
    for request_class, cells in sorted(by_class.items()):
        base = next((cells[p] for p in offs if p in cells), None)
        if base is None:
            continue
        for profile, row in sorted(cells.items(), key=lambda item: profiles.get(item[0], 99)):
            if profiles.get(profile, 0) == 0:
                continue
            out.append(
                {
                    "request_class": request_class,
                    "profile": profile,
                    "depth": profiles.get(profile),
                    "off_tok_s": base["decode_tok_s"],
                    "tok_s": row["decode_tok_s"],
                    "speedup": round(float(row["decode_tok_s"]) / float(base["decode_tok_s"]), 3),
                    "samples": [base["samples"], row["samples"]],
                    "trusted": bool(base["trusted"] and row["trusted"]),
                }
            )
    return out


def _summary(deepest: int, levels: Sequence[Mapping[str, Any]]) -> str:
    """The calibration's answer in one line, load level by load level."""
    if not levels:
        return "not measured"
    parts = []
    for level in levels:
        ratio = level["ratio"]
        if level["pays"]:
            said = f"drafting pays: depth {deepest} decodes {ratio:.2f}x as fast as depth 0"
        else:
            said = f"off wins: depth {deepest} decodes {ratio:.2f}x as fast as depth 0"
        parts.append(f"{level['words']}, {said}")
    return "; ".join(parts)

"""The recommendation: the fewest draft settings that capture the measured gain, as profiles.

Per class, a setting is a candidate when it is faster than off beyond the spread (never with a
single repeat: no spread, no claim) and the fastest setting does not beat it beyond the spread.
A class needs speculation when it has a candidate. The recommendation is off plus the smallest
set of settings that puts one candidate into every class that needs speculation (exact search;
ties go to the set with the larger total speedup).

Profile names say the setting and never change meaning: ``off``, ``n3`` (n_max 3), ``n3-m1``
(n_max 3, n_min 1), ``n2-p0.5`` (p_min 0.5). The router's roles (the cold rules' "max" and
"min") are given to them in ``[routing]``: the deepest speculative profile plays max, the next
one min. A reason to keep a profile is always a figure above off: a cell at or below off is
never one.

A run is provisional when it was interrupted or when a cell has a single repeat: it recommends
nothing over off that lacks a spread, and it lists what looked faster as candidates only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass
from proxy.routing.stats import LearnedStats
from proxy.tune.measure.reading import Measurement
from proxy.tune.plan.grid import OFF, DraftSetting
from proxy.tune.report.analysis import Cell, Table
from proxy.tune.report.labels import class_words, split_level

_MAX_SEARCH = 6  # more profiles than this is no recommendation anyway


@dataclass
class Profile:
    name: str
    setting: DraftSetting
    reasons: list[str] = field(default_factory=list)


@dataclass
class Recommendation:
    profiles: list[Profile]
    needs: dict[str, list[DraftSetting]]  # class -> candidates, for classes needing speculation
    notes: list[str] = field(default_factory=list)
    provisional: str | None = None
    """Why the run is provisional (interrupted, one repeat), or None when it is complete."""

    def profile_of(self, setting: DraftSetting) -> Profile | None:
        return next((p for p in self.profiles if p.setting == setting), None)

    def roles(self) -> dict[str, str]:
        """The [routing] role fields: off plays off, the deepest speculative profile max, the
        next min (left as configured when there is no second one)."""
        spec = sorted(
            (p.setting for p in self.profiles if not p.setting.is_off),
            key=lambda s: (s.n_max or 0, s.n_min or 0),
            reverse=True,
        )
        roles = {"profile_off": OFF.name}
        if spec:
            roles["profile_max"] = spec[0].name
        if len(spec) > 1:
            roles["profile_min"] = spec[1].name
        return roles


def candidates(cells: list[Cell], off: Cell) -> list[DraftSetting]:
    """Settings faster than off beyond the spread that the fastest does not beat beyond it."""
    faster = [c for c in cells if c is not off and c.better_than(off) and _above_off(c)]
    if not faster:
        return []
    best = max(faster, key=lambda c: c.tok_s.median)
    return [c.setting for c in faster if c is best or not best.better_than(c)]


def _above_off(cell: Cell) -> bool:
    """The paired figure agrees: a setting whose paired speedup is at or below 1 is no reason."""
    return cell.speedup is None or cell.speedup.median > 1.0


def recommend(table: Table, *, interrupted: bool = False) -> Recommendation:
    needs: dict[str, list[DraftSetting]] = {}
    notes: list[str] = []
    for label in table.classes():
        if split_level(label)[1] > 1:
            continue  # busy cells: measured beside users' requests, reported only
        off = table.cell(label, OFF)
        if off is None:
            notes.append(f"{class_words(label)}: off was not measured, no speedup to judge")
            continue
        found = candidates(table.of_class(label), off)
        if found:
            needs[label] = found
    chosen = _smallest_cover(needs, table)
    profiles = [Profile(OFF.name, OFF), *(Profile(s.name, s) for s in _ordered(chosen))]
    for p in profiles:
        p.reasons = _reasons(p.setting, table, needs)
    provisional = _provisional(table, interrupted)
    if provisional:
        notes += _single_repeat_candidates(table)
    return Recommendation(profiles, needs, notes, provisional)


def _provisional(table: Table, interrupted: bool) -> str | None:
    why = []
    if interrupted:
        why.append("the run was interrupted")
    alone = [c for c in table.cells if c.level == 1]
    if any(c.repeats < 2 for c in alone):
        single = sum(1 for c in alone if c.repeats < 2)
        why.append(f"{single} of {len(alone)} cells have one repeat (no spread to judge by)")
    return "; ".join(why) or None


def _single_repeat_candidates(table: Table) -> list[str]:
    """What looked faster than off on one measurement: named, not recommended."""
    out = []
    for label in table.classes():
        off = table.cell(label, OFF)
        if off is None or split_level(label)[1] > 1:
            continue
        faster = [
            c
            for c in table.of_class(label)
            if c is not off
            and min(c.repeats, off.repeats) < 2
            and c.speedup is not None
            and c.speedup.median > 1.0
        ]
        if faster:
            best = max(faster, key=lambda c: c.speedup.median if c.speedup else 0.0)
            assert best.speedup is not None
            out.append(
                f"candidate, not recommended ({best.repeats} repeat): {class_words(label)}: "
                f"{best.setting.label} {best.speedup.median:.2f}x off"
            )
    return out


def _ordered(settings: list[DraftSetting]) -> list[DraftSetting]:
    """Shallowest first, as a config lists off < min < max."""
    return sorted(settings, key=lambda s: (s.n_max or 0, s.n_min or 0, s.p_min or 0.0))


def _smallest_cover(needs: dict[str, list[DraftSetting]], table: Table) -> list[DraftSetting]:
    if not needs:
        return []
    pool = sorted({s for top in needs.values() for s in top}, key=lambda s: s.name)
    for size in range(1, min(len(pool), _MAX_SEARCH) + 1):
        covers: list[tuple[DraftSetting, ...]] = [
            combo
            for combo in itertools.combinations(pool, size)
            if all(any(s in top for s in combo) for top in needs.values())
        ]
        if covers:

            def rank(combo: tuple[DraftSetting, ...]) -> tuple[float, tuple[str, ...]]:
                return (_captured(combo, table), tuple(s.name for s in combo))

            best: tuple[DraftSetting, ...] = max(covers, key=rank)
            return list(best)
    return pool  # unreachable: the candidates cover every class by construction


def _captured(combo: tuple[DraftSetting, ...], table: Table) -> float:
    """Sum over classes of the best median speedup the combination (with off) reaches."""
    total = 0.0
    for label in table.classes():
        speedups = [
            c.speedup.median
            for c in table.of_class(label)
            if c.speedup is not None and (c.setting in combo or c.setting == OFF)
        ]
        total += max(speedups, default=1.0)
    return total


def _reasons(
    setting: DraftSetting, table: Table, needs: dict[str, list[DraftSetting]]
) -> list[str]:
    """Why a profile is kept: for off, the classes no setting beats it in; for the others,
    the classes where they are faster than off beyond the spread (never a figure at or below
    off)."""
    out = []
    for label in table.classes():
        cell = table.cell(label, setting)
        if cell is None or split_level(label)[1] > 1:
            continue
        words = class_words(label)
        if setting == OFF and label not in needs:
            out.append(f"{words}: no setting beats off beyond the spread ({_figure(cell)})")
        elif setting in needs.get(label, []):
            out.append(f"{words}: {_figure(cell)}, faster than off beyond the spread")
    return out


def _figure(cell: Cell) -> str:
    t = cell.tok_s
    text = f"{t.median:.1f} tok/s ({t.lo:.1f}-{t.hi:.1f})"
    if cell.speedup is not None and cell.setting != OFF:
        s = cell.speedup
        text += f", {s.median:.2f}x off ({s.lo:.2f}-{s.hi:.2f}, paired)"
    if cell.acceptance is not None:
        text += f", acceptance {cell.acceptance.median:.0%}"
    return text + f", {cell.repeats} repeats"


def seed_state(
    table: Table,
    recommendation: Recommendation,
    measurements: list[Measurement],
    routing: RoutingSettings,
    model: str,
    base: LearnedStats | None = None,
) -> LearnedStats:
    """The router's statistics as if it had served the measured requests on the recommended
    profiles, added to ``base`` (the service's own state, when applying) or to an empty state.
    A cell gets at least ``min_samples`` observations (its measured requests, again in order
    where there are fewer): the measurements were made side by side on purpose and deserve the
    trust that routing otherwise waits for. Only requests measured alone are seeded: beside
    users' requests at other depths a request's speed is the mix's, which the router learns
    itself (routing.busy)."""
    stats = base if base is not None else LearnedStats(routing)
    if table.calibrator is not None:
        stats.calibrator = table.calibrator
    cells: dict[tuple[RequestClass, str], list[Measurement]] = {}
    for m in measurements:
        cls = table.classes_of.get((m.setting, m.item, m.repeat))
        profile = next((p for p in recommendation.profiles if p.setting.name == m.setting), None)
        if cls is None or profile is None or not m.alone:
            continue
        cells.setdefault((cls, profile.name), []).append(m)
    for (cls, profile_name), ms in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        ordered = sorted(ms, key=lambda m: (m.repeat, m.item))
        n = max(len(ordered), routing.min_samples)
        for i in range(n):
            obs = ordered[i % len(ordered)].observation(cls, profile_name)
            # Each request was measured alone: the pool's cell (level 0) and, for a model served
            # by one process with per-request depths, its "alone" load level.
            for level in (0, routing.concurrency_levels[0]):
                stats.observe(cls, profile_name, obs, model=model, level=level)
    return stats


def measured_headline(table: Table) -> str | None:
    """What the run measured, in one line, whatever it may recommend: the setting that was
    fastest in the most classes measured alone, its speedups over off, and where off was
    fastest. None when no class has off and another setting measured alone. A provisional
    run recommends off; this line says what it saw, so nobody reads "off" as the finding."""
    wins: dict[DraftSetting, list[float]] = {}
    off_fastest, judged = 0, 0
    for label in table.classes():
        off = table.cell(label, OFF)
        others = [c for c in table.of_class(label) if c is not off and c.speedup is not None]
        if off is None or split_level(label)[1] > 1 or not others:
            continue
        judged += 1
        best = max(others, key=lambda c: c.speedup.median if c.speedup else 0.0)
        assert best.speedup is not None
        if best.speedup.median > 1.0:
            wins.setdefault(best.setting, []).append(best.speedup.median)
        else:
            off_fastest += 1
    if not judged:
        return None
    if not wins:
        return f"off measured fastest in every class measured alone ({judged})"
    setting, speedups = max(wins.items(), key=lambda item: (len(item[1]), max(item[1])))
    span = f"{min(speedups):.2f}x" + (
        f"-{max(speedups):.2f}x" if max(speedups) > min(speedups) else ""
    )
    text = (
        f"{setting.label} measured fastest in {len(speedups)} of {judged} classes measured "
        f"alone, {span} off's speed"
    )
    rest = sum(len(v) for s, v in wins.items() if s != setting)
    if rest:
        text += f"; another setting in {rest}"
    return text + (f"; off in {off_fastest}" if off_fastest else "")

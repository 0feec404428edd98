"""The recommendation: the fewest draft settings that capture the measured gain, as profiles.

Per class, the settings "at the top" are the fastest one and every setting it does not beat
beyond the spread. A class needs speculation when off is not at the top. The recommendation is
off plus the smallest set of settings that puts one top setting into every class that needs
speculation (exact search; ties go to the set with the larger total speedup). Profile names
follow the router's roles where they fit: the deeper speculative profile is ``max`` (cold rule:
short requests), the shallower ``min`` (long-context code), others keep their setting name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass
from proxy.routing.stats import LearnedStats
from proxy.tune.analysis import Cell, Table
from proxy.tune.grid import OFF, DraftSetting
from proxy.tune.measure import Measurement

_MAX_SEARCH = 6  # more profiles than this is no recommendation anyway


@dataclass
class Profile:
    name: str
    setting: DraftSetting
    reasons: list[str] = field(default_factory=list)


@dataclass
class Recommendation:
    profiles: list[Profile]
    needs: dict[str, list[DraftSetting]]  # class -> top settings, for classes needing spec
    notes: list[str] = field(default_factory=list)

    def profile_of(self, setting: DraftSetting) -> Profile | None:
        return next((p for p in self.profiles if p.setting == setting), None)


def top_settings(cells: list[Cell]) -> list[DraftSetting]:
    """The fastest setting of a class and every one it does not beat beyond the spread."""
    best = max(cells, key=lambda c: c.tok_s.median)
    return [c.setting for c in cells if c is best or not best.better_than(c)]


def recommend(table: Table) -> Recommendation:
    needs: dict[str, list[DraftSetting]] = {}
    notes: list[str] = []
    for label in table.classes():
        cells = table.of_class(label)
        if table.cell(label, OFF) is None:
            notes.append(f"{label}: off was not measured, no speedup to judge")
            continue
        top = top_settings(cells)
        if OFF not in top:
            needs[label] = top
    chosen = _smallest_cover(needs, table)
    profiles = [Profile("off", OFF), *_named(chosen)]
    for p in profiles:
        p.reasons = _reasons(p.setting, table, needs)
    if any(c.repeats < 2 for c in table.cells):
        notes.append("one repeat: no spread to judge by, so no setting is declared better")
    return Recommendation(profiles, needs, notes)


def _smallest_cover(needs: dict[str, list[DraftSetting]], table: Table) -> list[DraftSetting]:
    if not needs:
        return []
    candidates = sorted({s for top in needs.values() for s in top}, key=lambda s: s.name)
    for size in range(1, min(len(candidates), _MAX_SEARCH) + 1):
        covers: list[tuple[DraftSetting, ...]] = [
            combo
            for combo in itertools.combinations(candidates, size)
            if all(any(s in top for s in combo) for top in needs.values())
        ]
        if covers:

            def rank(combo: tuple[DraftSetting, ...]) -> tuple[float, tuple[str, ...]]:
                return (_captured(combo, table), _key(combo))

            best: tuple[DraftSetting, ...] = max(covers, key=rank)
            return list(best)
    return candidates  # unreachable: the candidates cover every class by construction


def _key(combo: tuple[DraftSetting, ...]) -> tuple[str, ...]:
    return tuple(s.name for s in combo)


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


def _named(settings: list[DraftSetting]) -> list[Profile]:
    """max = the deepest (most drafted) of the speculative profiles, min = the next one."""
    ranked = sorted(settings, key=lambda s: (s.n_max or 0, s.n_min or 0), reverse=True)
    names = ["max", "min"]
    return [Profile(names[i] if i < len(names) else s.name, s) for i, s in enumerate(ranked)][::-1]


def _reasons(
    setting: DraftSetting, table: Table, needs: dict[str, list[DraftSetting]]
) -> list[str]:
    out = []
    for label in table.classes():
        cell = table.cell(label, setting)
        if cell is None:
            continue
        top = needs.get(label)
        if setting == OFF and top is None:
            out.append(f"{label}: no setting beats off beyond the spread ({_figure(cell)})")
        elif top is not None and setting in top:
            out.append(f"{label}: {_figure(cell)}, at the top")
    return out


def _figure(cell: Cell) -> str:
    t = cell.tok_s
    text = f"{t.median:.1f} tok/s ({t.lo:.1f}-{t.hi:.1f})"
    if cell.speedup is not None and cell.setting != OFF:
        text += f", {cell.speedup.median:.2f}x off"
    if cell.acceptance is not None:
        text += f", acceptance {cell.acceptance.median:.0%}"
    return text + f", {cell.repeats} repeats"


def seed_state(
    table: Table,
    recommendation: Recommendation,
    measurements: list[Measurement],
    routing: RoutingSettings,
    model: str,
) -> LearnedStats:
    """The router's statistics as if it had served the measured requests on the recommended
    profiles. A cell gets at least ``min_samples`` observations (its measured requests, again
    in order where there are fewer): the measurements were made side by side on purpose and
    deserve the trust that routing otherwise waits for. Busier load levels of a one-process
    model are not seeded: tune measures requests alone, and the router learns those itself."""
    stats = LearnedStats(routing)
    if table.calibrator is not None:
        stats.calibrator = table.calibrator
    cells: dict[tuple[RequestClass, str], list[Measurement]] = {}
    for m in measurements:
        cls = table.classes_of.get((m.setting, m.item, m.repeat))
        profile = next((p for p in recommendation.profiles if p.setting.name == m.setting), None)
        if cls is None or profile is None:
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

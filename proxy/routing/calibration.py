"""A backend's start-up calibration: what drafting does to its decode speed, alone and busy.

Published runs disagree on whether MTP pays while several requests decode at once: -19 % to
-30 % at 2-4 parallel requests on Vulkan and older CUDA builds, +100 % at 4 on a newer CUDA
build (docs/published-figures.md#concurrency). So instead of a fixed prior the proxy measures
each process serving per-request depths once, when it is ready and probed
(``proxy.routing.calibrate``): decode speed at depth 0 and at its deepest depth, alone and with
every slot decoding. This module is the pure part: the measurement as data, the cold rule it
implies per load level, and its JSON.

The cold rule per load level (``Calibration.cold_role``): beside others, the deepest depth
where it measured clearly faster than depth 0 (``BUSY_MARGIN``), else off (the busy epochs
then measure the other one and correct it, ``proxy.routing.busy``); alone, the content rules
stand (short -> max, long code -> min, long prose -> off) unless drafting lost even there,
then off. The measured gap also replaces the
published -25 % as the busy epochs' prior for a class not yet run at the other depth
(``Calibration.log_gap``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.config.routing import Role

CONTEXT_DECLINE_PER_KTOK = math.log(1.44 / 2.5) / 34.0
"""How drafting's lead falls with context, in log speed per 1,000 tokens of context (-0.016):
llama.cpp with 4 drafts, +147-152 % at a ~100-token context against +44 % at 34K
(docs/published-figures.md, "Long context and content"). The calibration measures short
prompts; a busy process serving long agent prompts is where its gap matters most, and there
it is this much smaller (docs/routing.md, "Start-up calibration")."""
BUSY_MARGIN = 0.05
"""Beside others the deepest depth is the cold pick only when it measured this much faster than
depth 0. Off when busy is what most published builds call for, and the measurement is noisy:
short requests finish at different times, so the tail of a burst decodes at a lower load
(docs/routing.md, "Start-up calibration")."""


KINDS = ("code", "prose")
"""The content kinds the calibration measures (``proxy.routing.calibrate.PROMPTS``)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """What one burst measured: ``requests`` requests decoding together at ``depth``."""

    load: int
    depth: int
    tok_s: float
    """Mean per-request decode speed (each request's predicted_n / predicted_ms)."""
    requests: int
    acceptance: float | None = None
    """Accepted / drafted over the burst; None when nothing was drafted."""


@dataclass(frozen=True, slots=True)
class KindCell:
    """One request of the calibration: its content kind, depth, speed and mean context (prompt
    + half the answer), and how many requests decoded with it (``load``). Alone, a first point
    of that kind's context trend (``choice.trend_estimates``); busy, that kind's gap beside
    others (``Calibration.ratio``)."""

    kind: str
    depth: int
    tok_s: float
    context: float
    load: int = 1


@dataclass(frozen=True, slots=True)
class Calibration:
    """One backend's measurement, keyed by its binary, model and flags (``key``)."""

    key: str
    binary: str
    model: str
    slots: int
    cells: tuple[Cell, ...]
    wall_s: float
    """What it cost on the proxy's clock."""
    backend_s: float
    """... and on the backend's own (timings: prompt + decode of each burst's slowest request),
    which for a simulator is simulated time, the cost on the GPU it stands for."""
    measured_at: float = 0.0
    """Unix time of the measurement."""
    tokens: int = 0
    """Output tokens of each request."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    alone_kinds: tuple[KindCell, ...] = ()
    """The alone requests one by one, by content kind (calibrations from before: none)."""
    busy_kinds: tuple[KindCell, ...] = ()
    """The busy bursts' requests one by one, by content kind (calibrations from before: none).
    Drafting's gap beside others differs by kind where acceptance does, so the burst's mean
    would speak for a mix the process may not serve (docs/routing.md, "Start-up calibration")."""

    @property
    def loads(self) -> list[int]:
        return sorted({c.load for c in self.cells})

    @property
    def deepest(self) -> int:
        return max((c.depth for c in self.cells), default=0)

    def speed(self, load: int, depth: int) -> float | None:
        return next((c.tok_s for c in self.cells if c.load == load and c.depth == depth), None)

    def measured_load(self, level: int) -> int | None:
        """The measured load that stands for a load level: alone for alone; for a busy level
        the busy load measured nearest to it, the smaller on a tie (a process never decodes more
        requests than it has slots)."""
        if level <= 1:
            return 1 if 1 in self.loads else None
        busy = [load for load in self.loads if load > 1]
        return min(busy, key=lambda load: (abs(load - level), load)) if busy else None

    def covers(self, loads: Iterable[int]) -> bool:
        """Whether it measured what the proxy now measures: every load, and beside others each
        request's content kind. One saved by an older proxy (the slot count only, no kinds)
        still loads, but is measured again at the next start (``proxy.routing.calibrate``)."""
        wanted = set(loads)
        kinds_needed = any(load > 1 for load in wanted)
        return set(self.loads) == wanted and (bool(self.busy_kinds) or not kinds_needed)

    def kind_speed(self, load: int, depth: int, kind: str) -> float | None:
        """The mean decode speed of the ``kind`` requests measured at that load and depth."""
        cells = self.alone_kinds if load == 1 else self.busy_kinds
        found = [c.tok_s for c in cells if c.load == load and c.depth == depth and c.kind == kind]
        return sum(found) / len(found) if found else None

    def ratio(self, level: int, kind: str | None = None) -> float | None:
        """Deepest depth's per-request decode speed over depth 0's, at that load level: of the
        ``kind`` requests where they were measured beside others (``busy_kinds``), else of all
        of them. A busy load below the slot count is pooled with the slot count's, in log and
        by their requests: its burst rests on one request of each kind per depth, too few to
        trust alone against the 5 % margin (docs/routing.md, "Start-up calibration")."""
        load = self.measured_load(level)
        if load is None or self.deepest == 0:
            return None
        here = self._measured_ratio(load, kind)
        top = max(self.loads)
        if here is None or load <= 1 or load == top:
            return here
        full = self._measured_ratio(top, kind)
        if full is None or full <= 0 or here <= 0:
            return here
        return math.exp((load * math.log(here) + top * math.log(full)) / (load + top))

    def _measured_ratio(self, load: int, kind: str | None) -> float | None:
        own = self._kind_ratio(load, kind) if kind is not None and load > 1 else None
        if own is not None:
            return own
        deep, plain = self.speed(load, self.deepest), self.speed(load, 0)
        return deep / plain if deep is not None and plain is not None and plain > 0 else None

    def _kind_ratio(self, load: int, kind: str) -> float | None:
        deep, plain = self.kind_speed(load, self.deepest, kind), self.kind_speed(load, 0, kind)
        return deep / plain if deep is not None and plain is not None and plain > 0 else None

    def log_gap(
        self, level: int, context_tokens: float = 0.0, kind: str | None = None
    ) -> float | None:
        """log(deepest / depth 0) at that load level, as measured on short prompts (of
        ``kind``: ``ratio``), and where ``context_tokens`` is given, carried to that context
        (``CONTEXT_DECLINE_PER_KTOK``): the busy epochs' prior."""
        ratio = self.ratio(level, kind)
        if ratio is None or ratio <= 0:
            return None
        return math.log(ratio) + CONTEXT_DECLINE_PER_KTOK * max(context_tokens, 0.0) / 1000.0

    def cold_role(
        self, level: int, context_tokens: float = 0.0, kinds: Mapping[str, float] | None = None
    ) -> Role | None:
        """The cold rule at a load level, for requests of ``context_tokens`` whose content is
        ``kinds`` (kind -> share; None: the calibration's own mix of code and prose). Busy
        (level >= 2): the deepest depth where it is expected ``BUSY_MARGIN`` faster there, else
        off. Alone: None (the content rules stand) unless drafting lost even on the short
        prompts, then "off"."""
        if level <= 1:
            gap = self.log_gap(level)
            return None if gap is None or gap >= 0.0 else "off"
        gap = self._mixed_gap(level, context_tokens, kinds or {})
        gap = self.log_gap(level, context_tokens) if gap is None else gap
        if gap is None:
            return None
        return "max" if gap >= math.log(1.0 + BUSY_MARGIN) else "off"

    def _mixed_gap(self, level: int, context: float, kinds: Mapping[str, float]) -> float | None:
        """The kinds' gaps weighted by their shares; None unless each was measured busy."""
        load = self.measured_load(level)
        total = sum(kinds.values())
        if load is None or load <= 1 or total <= 0:
            return None
        if any(self._kind_ratio(load, kind) is None for kind in kinds):
            return None  # log_gap would fall back to the burst's mean for that kind
        gaps = {kind: self.log_gap(level, context, kind) for kind in kinds}
        if None in gaps.values():
            return None
        return sum(share * (gaps[kind] or 0.0) for kind, share in kinds.items()) / total

    def cold_roles(self, levels: Iterable[int]) -> dict[int, Role]:
        """``cold_role`` of every level it says something about."""
        roles = {level: self.cold_role(level) for level in levels}
        return {level: role for level, role in roles.items() if role is not None}

    def acceptance(self) -> float | None:
        """Acceptance of the deepest depth alone (the collapse guard's expectation before a
        class has learned its own)."""
        alone = [c for c in self.cells if c.depth == self.deepest and c.load == min(self.loads)]
        return alone[0].acceptance if alone else None

    def findings(self, levels: Iterable[int]) -> dict[str, Any]:
        """For the log, /admin/routing and status: per level the ratio (by content kind where
        measured beside others) and the cold rule."""
        out: dict[str, Any] = {}
        for level in levels:
            ratio = self.ratio(level)
            out[str(level)] = {
                "deep_vs_off": None if ratio is None else round(ratio, 3),
                "cold_role": self.cold_role(level) or "rules",
            }
            load = self.measured_load(level)
            if load is not None and load > 1 and all(self._kind_ratio(load, k) for k in KINDS):
                by_kind = {k: round(self.ratio(level, k) or 0.0, 3) for k in KINDS}
                out[str(level)]["by_kind"] = by_kind
        return out

    def to_json(self) -> dict[str, Any]:
        """The learned file's form: numbers as measured (rounding them here and again in the
        report made a restart show 2576.97 where the first run showed 2576.98)."""
        return {
            "key": self.key,
            "binary": self.binary,
            "model": self.model,
            "slots": self.slots,
            "cells": [[c.load, c.depth, c.tok_s, c.requests, c.acceptance] for c in self.cells],
            "wall_s": self.wall_s,
            "backend_s": self.backend_s,
            "measured_at": self.measured_at,
            "tokens": self.tokens,
            "notes": list(self.notes),
            "alone_kinds": [[k.kind, k.depth, k.tok_s, k.context] for k in self.alone_kinds],
            "busy_kinds": [[k.kind, k.depth, k.tok_s, k.context, k.load] for k in self.busy_kinds],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        """ValueError (or KeyError, TypeError) on anything that is not a calibration."""
        cells = []
        for row in data["cells"]:
            load, depth, tok_s, requests, acceptance = row
            cell = Cell(int(load), int(depth), float(tok_s), int(requests), _fraction(acceptance))
            speed_ok = math.isfinite(cell.tok_s) and cell.tok_s > 0
            if cell.load < 1 or cell.depth < 0 or not speed_ok:
                raise ValueError(f"not a calibration cell: {row!r}")
            cells.append(cell)
        if not cells:
            raise ValueError("a calibration without measurements")
        return cls(
            key=str(data["key"]),
            binary=str(data["binary"]),
            model=str(data["model"]),
            slots=int(data["slots"]),
            cells=tuple(cells),
            wall_s=float(data["wall_s"]),
            backend_s=float(data["backend_s"]),
            measured_at=float(data.get("measured_at", 0.0)),
            tokens=int(data.get("tokens", 0)),
            notes=tuple(str(n) for n in data.get("notes", ())),
            alone_kinds=tuple(_kind_cell(row) for row in data.get("alone_kinds", ())),
            busy_kinds=tuple(_kind_cell(row) for row in data.get("busy_kinds", ())),
        )

    def report(self, levels: Iterable[int]) -> dict[str, Any]:
        """The admin view: what was measured, what it cost, what it decided."""
        return {
            **self.to_json(),
            "cells": [
                {
                    "load": c.load,
                    "depth": c.depth,
                    "tok_s": round(c.tok_s, 2),
                    "requests": c.requests,
                    "acceptance": None if c.acceptance is None else round(c.acceptance, 3),
                }
                for c in self.cells
            ],
            "levels": self.findings(levels),
        }


def _kind_cell(row: object) -> KindCell:
    """[kind, depth, tok_s, context] alone, with the load after it when busy."""
    if not isinstance(row, list) or len(row) not in (4, 5) or row[0] not in KINDS:
        raise ValueError(f"not a calibration request: {row!r}")
    load = int(row[4]) if len(row) == 5 else 1
    cell = KindCell(str(row[0]), int(row[1]), float(row[2]), float(row[3]), load)
    if cell.depth < 0 or cell.load < 1 or not (cell.tok_s > 0 and cell.context >= 0):
        raise ValueError(f"not a calibration request: {row!r}")
    return cell


def _fraction(value: object) -> float | None:
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"acceptance {number} is not within [0, 1]")
    return number

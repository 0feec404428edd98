"""Candidate draft settings: the default grid of each speculative type and the user's grid syntax.

A setting is what one ``[[models.profiles]]`` entry says about speculation: ``spec_type``,
``draft_n_max``, ``draft_n_min``, ``draft_p_min`` (None = llama-server's default), or "off".

Grid syntax (``--settings``): comma-separated settings, each ``off`` or ``N[/M][@P]``:
N = n_max, M = n_min (default: unset, llama-server's 0), P = p_min (default: unset, 0.75).
``default`` expands to the default grid. Example: ``off,1,2,2/1,3,3@0.5``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.spec_types import MTP, SPEC_TYPES, type_names

DEFAULT_SPEC_TYPE = MTP
MAX_N_MAX = 16
_SHALLOWEST = SPEC_TYPES[MTP].deepest  # a type measured like MTP: every depth up to 4
_ITEM = re.compile(r"^(?P<n_max>\d+)(?:/(?P<n_min>\d+))?(?:@(?P<p_min>\d*\.?\d+))?$")

QUICK_GRID = "off,2,3,3/1"
"""`tune --quick`'s grid: off and the depths the cold rules name."""


class GridError(ValueError):
    """A --settings value that is not a grid; the message names the bad item."""


@dataclass(frozen=True)
class DraftSetting:
    """One candidate draft setting; ``n_max`` None means speculation off."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    spec_type: str = DEFAULT_SPEC_TYPE

    @property
    def is_off(self) -> bool:
        return self.n_max is None

    @property
    def name(self) -> str:
        """Stable, file-name safe: off, n2, n2-m1, n3-p0.5."""
        if self.n_max is None:
            return "off"
        name = f"n{self.n_max}"
        if self.n_min is not None:
            name += f"-m{self.n_min}"
        if self.p_min is not None:
            name += f"-p{self.p_min:g}"
        return name

    @property
    def label(self) -> str:
        """Human form for tables and charts: off, n_max 2 / n_min 1 / p_min 0.5."""
        if self.n_max is None:
            return "off"
        parts = [f"n_max {self.n_max}"]
        if self.n_min is not None:
            parts.append(f"n_min {self.n_min}")
        if self.p_min is not None:
            parts.append(f"p_min {self.p_min:g}")
        return " / ".join(parts)

    def profile_fields(self) -> dict[str, object]:
        """The ``[[models.profiles]]`` fields of this setting (none at all for off)."""
        if self.n_max is None:
            return {}
        fields: dict[str, object] = {"spec_type": self.spec_type, "draft_n_max": self.n_max}
        if self.n_min is not None:
            fields["draft_n_min"] = self.n_min
        if self.p_min is not None:
            fields["draft_p_min"] = self.p_min
        return fields

    def process_key(self) -> tuple[str, int | None, float | None] | None:
        """Settings with equal keys can share one process when the backend honours a
        per-request depth: the per-request field is n_max only (None: off needs no process)."""
        if self.n_max is None:
            return None
        return (self.spec_type, self.n_min, self.p_min)


OFF = DraftSetting()


def default_grid(spec_type: str = DEFAULT_SPEC_TYPE) -> list[DraftSetting]:
    """The settings worth measuring for a speculative type, as deep as its table row says
    (supervisor.spec_types): shallow for MTP, deep for a draft model or an n-gram type."""
    names = type_names(spec_type)
    spec = SPEC_TYPES.get(names[0]) if len(names) == 1 else None
    if spec is None or spec.deepest <= _SHALLOWEST:
        return _shallow_grid(spec_type, spec.deepest if spec is not None else _SHALLOWEST)
    depths = sorted({*_doublings(spec.deepest), *spec.depths})
    return [OFF, *(DraftSetting(n, spec_type=spec_type) for n in depths)]


def _doublings(deepest: int) -> list[int]:
    """2, 4, 8 ... up to ``deepest``: a deep type's gain moves with the depth's order."""
    return [1 << k for k in range(1, deepest.bit_length()) if 1 << k <= deepest]


def _shallow_grid(spec_type: str, deepest: int) -> list[DraftSetting]:
    """off; n_max 1 to ``deepest`` with n_min 0-2 (n_min <= n_max); p_min 0.5 and 0.9 where it
    matters.

    p_min only gates drafts past the n_min forced ones, and matters most with n_min 0, where
    it decides whether a step drafts at all; so it is varied there, at n_max 2 and 3.
    """
    grid = [OFF]
    for n_max in range(1, deepest + 1):
        grid.append(DraftSetting(n_max, spec_type=spec_type))
        for n_min in range(1, min(2, n_max) + 1):
            grid.append(DraftSetting(n_max, n_min, spec_type=spec_type))
    for n_max in (2, 3):
        for p_min in (0.5, 0.9):
            grid.append(DraftSetting(n_max, None, p_min, spec_type=spec_type))
    return grid


def parse_grid(text: str, spec_type: str = DEFAULT_SPEC_TYPE) -> list[DraftSetting]:
    """Parse the grid syntax (module docstring); order kept, duplicates dropped."""
    settings: list[DraftSetting] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        if item == "default":
            settings += default_grid(spec_type)
            continue
        settings.append(_parse_item(item, spec_type))
    unique = list(dict.fromkeys(settings))
    if not unique:
        raise GridError("no settings given (example: off,1,2,2/1,3)")
    return unique


def _parse_item(item: str, spec_type: str) -> DraftSetting:
    if item == "off":
        return OFF
    match = _ITEM.match(item)
    if match is None:
        raise GridError(f"{item!r}: expected off or N[/M][@P], e.g. 2/1 or 3@0.5")
    n_max = int(match["n_max"])
    n_min = int(match["n_min"]) if match["n_min"] is not None else None
    p_min = float(match["p_min"]) if match["p_min"] is not None else None
    if not 1 <= n_max <= MAX_N_MAX:
        raise GridError(f"{item!r}: n_max must be within 1-{MAX_N_MAX}")
    if n_min is not None and n_min > n_max:
        raise GridError(f"{item!r}: n_min must not exceed n_max")
    if p_min is not None and not 0.0 <= p_min <= 1.0:
        raise GridError(f"{item!r}: p_min must be within [0, 1]")
    return DraftSetting(n_max, n_min, p_min, spec_type)

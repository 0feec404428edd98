"""From measured requests to the table: per setting x request class, median and spread.

Classes are the router's own (``proxy.routing.classes``): content kind from the router's
features of the request as sent, context bucket from the prompt-token estimate with the
chars-per-token ratio calibrated on these very answers (what a warm router uses).

Per repeat, a (setting, class) cell combines its requests: decode tok/s = output tokens / decode
seconds, acceptance = accepted / drafted, goodput = output tokens / (prefill + decode) seconds.
Over repeats: the median and the spread (lowest and highest repeat). Speedup over off is
paired by repeat (same prompts, same answers). One setting is better than another only when
their spreads do not overlap; with a single repeat there is no spread and nothing is claimed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.apis import API_OF_PATH
from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass, classify, load_level
from proxy.routing.features import RequestFeatures, extract_features
from proxy.routing.stats import TokenCalibrator
from proxy.tune.measure.reading import Measurement
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.plan.workload import Workload
from proxy.tune.report.labels import class_order, split_level, with_level


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        vs = sorted(values)
        if not vs:
            return None
        return cls(statistics.median(vs), vs[0], vs[-1])

    def to_json(self, digits: int) -> dict[str, float]:
        return {
            "median": round(self.median, digits),
            "lo": round(self.lo, digits),
            "hi": round(self.hi, digits),
        }


@dataclass(frozen=True)
class Cell:
    """One row of the table: a setting in a request class."""

    setting: DraftSetting
    label: str  # the class label, e.g. "16k-32k/code"
    repeats: int
    requests: int
    tok_s: Spread
    acceptance: Spread | None
    prefill_s: Spread | None
    goodput: Spread | None
    speedup: Spread | None  # over off, paired by repeat; None without an off measurement
    mode: str
    level: int = 1  # load level: 1 alone, else the router's concurrency level it ran at

    def better_than(self, other: Cell) -> bool:
        """Faster beyond both spreads (never with a single repeat: no spread to judge)."""
        if min(self.repeats, other.repeats) < 2:
            return False
        return self.tok_s.lo > other.tok_s.hi


@dataclass
class Table:
    cells: list[Cell] = field(default_factory=list)
    chars_per_token: float = 0.0
    calibrator: TokenCalibrator | None = None
    classes_of: dict[tuple[str, str, int], RequestClass] = field(default_factory=dict)
    """(setting, item, repeat) -> the router's class of that request."""

    def classes(self) -> list[str]:
        return sorted({c.label for c in self.cells}, key=class_order)

    def of_class(self, label: str) -> list[Cell]:
        return [c for c in self.cells if c.label == label]

    def cell(self, label: str, setting: DraftSetting) -> Cell | None:
        return next((c for c in self.of_class(label) if c.setting == setting), None)


def analyse(
    measurements: list[Measurement],
    workload: Workload,
    grid: list[DraftSetting],
    routing: RoutingSettings,
    model: str,
) -> Table:
    items = {item.id: item for item in workload.items}
    settings = {s.name: s for s in grid}
    kept = [m for m in measurements if m.item in items and m.setting in settings]
    # The bodies as sent (one copy of a long prompt each, reused for both passes below).
    sent = {id(m): items[m.item].request(m.tag) for m in kept}
    features = {id(m): _features(items[m.item].path, sent[id(m)], model) for m in kept}
    calibrator = TokenCalibrator(routing.chars_per_token, routing.chars_per_token_half_life)
    for m in kept:
        if m.context_tokens:
            calibrator.observe(features[id(m)], m.context_tokens)
    cpt = calibrator.chars_per_token(model)
    table = Table(chars_per_token=cpt, calibrator=calibrator)
    groups: dict[tuple[str, str], dict[int, list[Measurement]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for m in kept:
        cls = classify(_features(items[m.item].path, sent[id(m)], model, cpt), routing)
        table.classes_of[(m.setting, m.item, m.repeat)] = cls
        level = 1 if m.alone else load_level(1 + (m.others or 0.0), routing)
        groups[(m.setting, with_level(cls.label, level))][m.repeat].append(m)
    off = {label: by_repeat for (name, label), by_repeat in groups.items() if name == "off"}
    for (name, label), by_repeat in sorted(groups.items()):
        cell = _cell(settings[name], label, by_repeat, off.get(label, {}))
        if cell is not None:
            table.cells.append(cell)
    return table


def _features(
    path: str, body: Mapping[str, Any], model: str, chars_per_token: float = 1.0
) -> RequestFeatures:
    """The router's features of a request as sent (with a calibrated ratio: as a warm router
    estimates its prompt tokens)."""
    return extract_features(
        API_OF_PATH[path], {**body, "model": model}, chars_per_token=chars_per_token,
        session_header=None, pin_header=None,
    )  # fmt: skip


def _combined(
    ms: list[Measurement],
) -> tuple[float | None, float | None, float | None, float | None]:
    """(decode tok/s, acceptance, mean prefill s, goodput) of one repeat's requests."""
    timed = [m for m in ms if m.decode_s]
    out = sum(m.output_tokens for m in timed)
    decode_s = sum(m.decode_s or 0.0 for m in timed)
    tok_s = out / decode_s if decode_s > 0 else None
    drafted = sum(m.draft_n or 0 for m in ms)
    accepted = sum(m.draft_n_accepted or 0 for m in ms)
    acceptance = accepted / drafted if drafted > 0 else None
    prefills = [m.prefill_s for m in ms if m.prefill_s is not None]
    prefill = statistics.fmean(prefills) if prefills else None
    busy = decode_s + sum(m.prefill_s or 0.0 for m in timed)
    goodput = out / busy if busy > 0 else None
    return tok_s, acceptance, prefill, goodput


def paired_ratios(
    by_repeat: Mapping[int, list[Measurement]], off: Mapping[int, list[Measurement]]
) -> list[float]:
    """Per repeat, decode tok/s over off's on the requests both answered in that repeat."""
    ratios = []
    for r, ms in by_repeat.items():
        theirs = {m.item: m for m in off.get(r, [])}
        common = [m for m in ms if m.item in theirs]
        mine = _combined(common)[0]
        base = _combined([theirs[m.item] for m in common])[0]
        if mine is not None and base:
            ratios.append(mine / base)
    return ratios


def _cell(
    setting: DraftSetting,
    label: str,
    by_repeat: Mapping[int, list[Measurement]],
    off: Mapping[int, list[Measurement]],
) -> Cell | None:
    combined = {r: _combined(ms) for r, ms in by_repeat.items()}
    tok_s = Spread.of(v[0] for v in combined.values() if v[0] is not None)
    if tok_s is None:
        return None
    ratios = paired_ratios(by_repeat, off)
    modes = {m.mode for ms in by_repeat.values() for m in ms}
    return Cell(
        setting=setting,
        label=label,
        repeats=sum(1 for v in combined.values() if v[0] is not None),
        requests=sum(len(ms) for ms in by_repeat.values()),
        tok_s=tok_s,
        acceptance=Spread.of(v[1] for v in combined.values() if v[1] is not None),
        prefill_s=Spread.of(v[2] for v in combined.values() if v[2] is not None),
        goodput=Spread.of(v[3] for v in combined.values() if v[3] is not None),
        speedup=Spread.of(ratios),
        mode="/".join(sorted(modes)),
        level=split_level(label)[1],
    )

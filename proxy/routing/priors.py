"""Learned state that knows what it learned on, and other boxes' learned state as priors.

Each model's cells are keyed by what they were measured on (``LearnedKey``): the backend build,
the model file, the speculative type, the draft model and the box. When the key changes (a new
llama-server, another GGUF, another type) the cells are dropped, logged ``learned_state_stale``,
and the model starts again from its priors.

An export (``mtp-proxy learned export``) is every cell as additive statistics (weights, sums and
sums of squares, counts; never ratios), so that merging the exports of many boxes is a sum. An
import checks every file whole before anything is merged: a file that is truncated, of another
format or version, or holds a number that is not finite or negative is refused, and so is one
whose key differs from this box's in anything but the box (the message names the field). The
merged priors seed the cells a box has not learned itself, weighing ``routing.prior_weight`` of
its own requests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import structlog

from proxy.routing.stats import LearnedStats

EXPORT_FORMAT = "mtp-proxy-learned-export"
EXPORT_VERSION = 1
SUMS = ("decode", "prefill", "output", "load", "context", "acceptance")
_ROW_KEYS = ("model", "bucket", "kind", "level", "profile")


@dataclass(frozen=True)
class LearnedKey:
    """What one model's learned state is valid for."""

    build: str  # the backend's `--version` (the simulator's version)
    model_hash: str  # size and a hash of the GGUF's first MiB (proxy.plans.learned_keys)
    spec_type: str
    draft_model: str  # the draft model's size and hash the same way; "" without one
    box: str

    def as_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> LearnedKey:
        values = {name: data.get(name) for name in KEY_FIELDS}
        if not all(isinstance(v, str) for v in values.values()):
            raise ValueError(f"a learned key holds the strings {', '.join(KEY_FIELDS)}")
        return cls(**{k: str(v) for k, v in values.items()})

    def differences(self, other: LearnedKey, fields: Iterable[str]) -> list[str]:
        return [name for name in fields if getattr(self, name) != getattr(other, name)]


KEY_FIELDS = ("build", "model_hash", "spec_type", "draft_model", "box")
SHARED_FIELDS = KEY_FIELDS[:-1]
"""What another box's export must share with this one; the box itself differs by design."""


class ExportRefused(ValueError):
    """An export that is not merged, and why (the file's name first)."""


def export_document(stats: LearnedStats, keys: Mapping[str, LearnedKey]) -> dict[str, Any]:
    """The export of ``stats``: its cells as sums, under the keys they were learned on."""
    learned = {model: key.as_json() for model, key in keys.items()}
    rows = [row for row in stats.additive_rows() if row["model"] in learned]
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "boxes": 1,
        "keys": learned,
        "cells": rows,
    }


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number an export may hold")


def read_export(raw: bytes, name: str) -> dict[str, Any]:
    """The export in ``raw``, checked whole; ExportRefused names the file and the problem."""
    try:
        document = json.loads(raw, parse_constant=_no_constant)
    except ValueError as exc:  # truncated, not JSON, NaN or Infinity
        raise ExportRefused(f"{name}: not a whole export ({str(exc)[:120]})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ExportRefused(f"{name}: not an mtp-proxy learned export")
    if document.get("version") != EXPORT_VERSION:
        raise ExportRefused(
            f"{name}: export version {document.get('version')!r}; this proxy reads version "
            f"{EXPORT_VERSION}"
        )
    try:
        _check(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportRefused(f"{name}: {exc}") from None
    return document


def _check(document: dict[str, Any]) -> None:
    keys, rows = document["keys"], document["cells"]
    if not isinstance(keys, dict) or not isinstance(rows, list):
        raise ValueError("keys must be an object and cells a list")
    for key in keys.values():
        LearnedKey.from_json(key)
    boxes = document.get("boxes", 1)
    if not isinstance(boxes, int) or boxes < 1:
        raise ValueError("boxes must be a positive whole number")
    for n, row in enumerate(rows):
        if not isinstance(row, dict) or not all(k in row for k in (*_ROW_KEYS, *SUMS)):
            raise ValueError(f"cell {n}: needs {', '.join((*_ROW_KEYS, *SUMS))}")
        if row["model"] not in keys or row["kind"] not in ("code", "prose"):
            raise ValueError(f"cell {n}: a model without a key, or an unknown kind")
        if not isinstance(row["level"], int) or not isinstance(row["bucket"], str):
            raise ValueError(f"cell {n}: level must be a whole number, bucket a name")
        for name in SUMS:
            sums = row[name]
            ok = isinstance(sums, list) and len(sums) == 4
            if not ok or not all(_finite(x) for x in sums):
                raise ValueError(f"cell {n}: {name} must be 4 finite numbers >= 0")


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def merge(
    documents: Iterable[tuple[str, dict[str, Any]]], keys: Mapping[str, LearnedKey]
) -> dict[str, Any]:
    """The sum of checked exports (name, document) whose keys match this box's ``keys`` in
    every shared field; ExportRefused names the first one that does not, and the field.
    Models this box does not serve are left out."""
    merged: dict[tuple[object, ...], list[list[float]]] = {}
    boxes = 0
    for name, document in documents:
        for model, data in document["keys"].items():
            if model not in keys:
                continue
            theirs, ours = LearnedKey.from_json(data), keys[model]
            differs = theirs.differences(ours, SHARED_FIELDS)
            if differs:
                field = differs[0]
                raise ExportRefused(
                    f"{name}: model {model}: {field} differs (export: "
                    f"{getattr(theirs, field)!r}, this box: {getattr(ours, field)!r})"
                )
        boxes += int(document.get("boxes", 1))
        for row in document["cells"]:
            if row["model"] not in keys:
                continue
            at = tuple(row[k] for k in _ROW_KEYS)
            sums = merged.setdefault(at, [[0.0] * 4 for _ in SUMS])
            for total, part in zip(sums, SUMS, strict=True):
                for i, x in enumerate(row[part]):
                    total[i] += x
    rows = [
        dict(zip(_ROW_KEYS, at, strict=True)) | dict(zip(SUMS, sums, strict=True))
        for at, sums in merged.items()
    ]
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "boxes": boxes,
        "keys": {model: key.as_json() for model, key in keys.items()},
        "cells": rows,
    }


def adopt(stats: LearnedStats, keys: Mapping[str, LearnedKey], weight: float) -> list[str]:
    """Hold ``stats`` to this box's ``keys``: a model learned under another key forgets it
    (logged ``learned_state_stale``); every model's unlearned cells start from the priors that
    share its key. The load report says what happened; returns the stale models' lines."""
    log = structlog.get_logger("proxy.routing.priors")
    stale: list[str] = []
    for model, key in keys.items():
        before = stats.keys.get(model)
        differs = _differences(before, key)
        if differs:
            dropped = stats.forget_model(model)
            line = f"{model} ({', '.join(differs)} changed)"
            stale.append(line)
            log.warning(
                "learned_state_stale",
                model=model,
                changed=differs,
                cells_dropped=dropped,
                action="starting from priors",
            )
        stats.keys[model] = key.as_json()
    seeded = stats.seed(_usable_priors(stats.priors, keys), weight)
    if stale:
        stats.load_report += "; learned_state_stale: " + ", ".join(stale)
    if seeded:
        stats.load_report += f"; {seeded} cells from priors"
    return stale


def _differences(before: dict[str, str] | None, key: LearnedKey) -> list[str]:
    if before is None:
        return []  # a file from before keys: kept as it is
    try:
        return LearnedKey.from_json(before).differences(key, KEY_FIELDS)
    except ValueError:
        return list(KEY_FIELDS)


def _usable_priors(priors: dict[str, Any], keys: Mapping[str, LearnedKey]) -> list[dict[str, Any]]:
    """The priors' rows of the models whose key they share; none from a file that fails the
    export's checks (it was written by an import, which checked it: a hand edit, then)."""
    if not priors:
        return []
    try:
        document = read_export(json.dumps(priors).encode(), "priors")
        return merge([("priors", document)], keys)["cells"]  # type: ignore[no-any-return]
    except ExportRefused as exc:
        structlog.get_logger("proxy.routing.priors").warning("priors_ignored", why=str(exc))
        return []

"""Measured results on disk, per setting, so a rerun resumes and Ctrl-C loses nothing.

    OUT/run.json                 what was measured: model, workload fingerprint, how (own
                                 processes or the service), the server's context, the warm-up
    OUT/settings/<setting>.jsonl one measured request per line, appended as it is measured

A rerun with the same model and workload skips every (setting, request, repeat) already in the
files; a different workload or model in the same OUT is refused (its results would mix).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from proxy.config.files import RESULTS_LIMIT, read_local_file
from proxy.tune.measure.reading import Measurement


class StoreError(ValueError):
    """OUT holds results of another run; the message says what differs."""


class ResultStore:
    def __init__(self, out: Path) -> None:
        self.out = out
        self._dir = out / "settings"
        self._done: dict[str, dict[tuple[str, int], Measurement]] = {}

    def previous(self) -> dict[str, Any] | None:
        """run.json of an earlier run in OUT (None: none, or unreadable)."""
        try:
            return self._run_file()
        except StoreError:
            return None

    def _run_file(self) -> dict[str, Any] | None:
        """run.json read bounded: None if there is none, StoreError if it is not ours (a FIFO
        there would block the reader, and then the writer, for ever)."""
        run_file = self.out / "run.json"
        if not run_file.exists():
            return None
        return _json_file(run_file)

    def check(self, meta: dict[str, Any]) -> None:
        """StoreError when OUT holds results of another run: another model, workload, or way of
        measuring (``meta`` may hold only some of these), or a run.json that is not ours."""
        old = self._run_file()
        if old is None:
            return
        for key in ("model", "workload", "via"):
            if key in meta and old.get(key, meta[key]) != meta[key]:
                raise StoreError(
                    f"{self.out} holds results of another {key} ({old.get(key)!r}, now "
                    f"{meta.get(key)!r}): choose another --out or remove it"
                )

    def open(self, meta: dict[str, Any]) -> None:
        """Check OUT against this run (``meta``: model, workload, how it is measured), record
        it, and load what is there."""
        self.check(meta)
        self._dir.mkdir(parents=True, exist_ok=True)
        (self.out / "run.json").write_text(json.dumps(meta, indent=2) + "\n", "utf-8")
        for path in sorted(self._dir.glob("*.jsonl")):
            for m in _read_lines(path):
                self._done.setdefault(m.setting, {})[(m.item, m.repeat)] = m

    def has(self, setting: str, item: str, repeat: int) -> bool:
        return (item, repeat) in self._done.get(setting, {})

    def add(self, m: Measurement) -> None:
        """Append one measurement and flush it to disk before going on."""
        with (self._dir / f"{m.setting}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(m.to_json(), separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._done.setdefault(m.setting, {})[(m.item, m.repeat)] = m

    def measurements(self) -> list[Measurement]:
        return [m for by_key in self._done.values() for m in by_key.values()]


def _json_file(path: Path) -> dict[str, Any]:
    """run.json, read bounded (proxy.config.files): StoreError if it is not ours."""
    try:
        data = json.loads(read_local_file(path, RESULTS_LIMIT))
    except (OSError, ValueError, RecursionError) as exc:
        raise StoreError(f"{path} is not a results file of mtp-proxy tune: {exc}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} is not a results file of mtp-proxy tune")
    return data


def _read_lines(path: Path) -> list[Measurement]:
    try:
        text = read_local_file(path, RESULTS_LIMIT).decode("utf-8", "replace")
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from None
    out = []
    for line in text.splitlines():
        try:
            out.append(Measurement.from_json(json.loads(line)))
        except (ValueError, TypeError, RecursionError):
            continue  # a line cut short by a kill: that request is measured again
    return out

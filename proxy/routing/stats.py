"""Learned statistics per (model, request class, profile), decayed so they follow drift.

A request class is a context-length bucket x content kind. Each (class, profile) cell keeps
exponentially weighted estimates of decode speed (mean and spread), prefill speed, output length
and acceptance (token-weighted: accepted / drafted). Decay is counted in observations of the
same cell: the estimate of a profile that is never chosen does not rot, exploration refreshes it.

The per-model chars-per-token calibrator lives here too (it is learned and persisted alike).
The state is a small JSON document, written atomically (temp file + os.replace) and loaded
tolerantly (missing or corrupt file: start empty and say so in ``load_report``). Version 1; the
backends' start-up calibrations (``calibrations``, keyed by binary, model and flags) were added
as an optional key: files without it load as before, and older readers ignore it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from proxy.config.files import read_local_file
from proxy.config.routing import RoutingSettings, decay_factor
from proxy.routing.busy import BusyDepths
from proxy.routing.calibration import Calibration
from proxy.routing.classes import RequestClass, bucket_labels
from proxy.routing.features import IMAGE_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE, RequestFeatures
from proxy.routing.telemetry import Observation

_STATE_VERSION = 1
CHANGE_SLACK = 0.15
"""Change detection (``_Cell.observe``): a trusted cell's decode speeds are compared with its
learned mean in log space, a two-sided CUSUM with this slack (~16 %, about a class's own spread
of per-request speeds) ..."""
CHANGE_LIMIT = 1.0
"""... which signals a change past this sum: a speed halved signals at the 2nd request, -30 %
at the 6th, +50 % at the 5th, while noise of the slack's size alone practically never adds up
to it (tests/unit/test_stats.py). On a signal
the class's cells (every profile, that load level) keep one observation's weight and lose their
trust, so the class explores again (ik_llama.cpp's autotune resets on a task change)."""
_MIN_DECODE_TOKENS = 4  # shorter outputs give no meaningful decode rate
_MIN_PREFILL_TOKENS = 32  # below this the fixed per-request overhead dominates
_MAX_STATE_BYTES = 16 << 20  # a learned file is kilobytes; anything far larger is not ours
_MAX_CHANGES = 20  # changes kept for /admin/routing
RECENT_POINTS = 8
"""Per (model, kind, load level, profile), the last requests' (context, decode speed) kept for
the context trend's local line (``choice.trend_estimates``); in memory only."""
_MAX_REASONS = 20  # untrusted parts named in the log line (the count says how many in all)
_DUMP_STEP = 256  # cells (or busy rows) serialized between two turns of the event loop


@dataclass(frozen=True, slots=True)
class Estimate:
    """What the statistics say about one profile in one class."""

    samples: float  # effective (decayed) weight of the decode-speed observations
    count: int  # decode-speed observations ever made (trust needs min_samples of them)
    decode_tok_s: float | None
    decode_sd: float
    acceptance: float | None  # accepted / drafted, None when nothing was drafted
    acceptance_samples: float
    acceptance_count: int
    prefill_tok_s: float | None
    output_tokens: float | None
    trusted: bool  # count >= min_samples
    decode_load: float = 0.0
    """Mean number of other requests on the backend while the decode speeds were measured:
    the speed already includes that load, so the policy scales it from this load to the
    current one instead of applying its load model on top (which counted load twice)."""
    context_tokens: float | None = None
    """Mean context (prompt tokens) of the requests whose decode speeds were measured: where a
    class's speed sits on the context axis (``choice.trend_estimates``)."""

    def acceptance_trusted(self, min_samples: int) -> float | None:
        if self.acceptance is None or self.acceptance_count < min_samples:
            return None
        return self.acceptance


class _Mean:
    """Exponentially weighted mean (and mean of squares), its effective weight and raw count."""

    __slots__ = ("m", "m2", "n", "w")

    def __init__(self, w: float = 0.0, m: float = 0.0, m2: float = 0.0, n: float = 0.0) -> None:
        self.w, self.m, self.m2, self.n = w, m, m2, n

    def decay(self, d: float) -> None:
        self.w *= d

    def add(self, x: float) -> None:
        self.n += 1.0
        self.w += 1.0
        self.m += (x - self.m) / self.w
        self.m2 += (x * x - self.m2) / self.w

    @property
    def sd(self) -> float:
        return math.sqrt(max(self.m2 - self.m * self.m, 0.0))

    def value(self) -> float | None:
        return self.m if self.w > 0 else None


class _Cell:
    __slots__ = (
        "acc_n",
        "acc_w",
        "accepted",
        "context",
        "decode",
        "drafted",
        "drift_down",
        "drift_up",
        "est",
        "load",
        "output",
        "prefill",
    )

    def __init__(self) -> None:
        self.decode = _Mean()
        self.load = _Mean()  # other requests in flight, weighted like the decode speeds
        self.context = _Mean()  # prompt tokens, weighted like the decode speeds
        self.prefill = _Mean()
        self.output = _Mean()
        self.drafted = 0.0
        self.accepted = 0.0
        self.acc_w = 0.0
        self.acc_n = 0.0
        self.drift_up = self.drift_down = 0.0  # the change detector's two sums (CHANGE_SLACK)
        self.est: Estimate | None = None  # cached until the next observation

    def observe(
        self,
        obs: Observation,
        d: float,
        prior_prefill: float,
        load: float,
        min_samples: int,
        max_decode: float = math.inf,
    ) -> bool:
        """Add one observation; True when its decode speed, with the trusted ones before it,
        says the cell's speed moved far from what it learned (``CHANGE_LIMIT``)."""
        for mean in (self.decode, self.prefill, self.output, self.load, self.context):
            mean.decay(d)
        self.drafted *= d
        self.accepted *= d
        self.acc_w *= d
        self.est = None
        out = obs.output_tokens
        if out is not None:
            self.output.add(float(out))
        ptoks = obs.prefill_tokens
        if ptoks is not None and ptoks >= _MIN_PREFILL_TOKENS and obs.prefill_s:
            self.prefill.add(ptoks / obs.prefill_s)
        decode = obs.decode_tok_s
        if decode is None and out is not None and obs.total_s:
            # Non-stream usage-only responses: subtract the expected prefill from the total.
            rate = self.prefill.value() or prior_prefill
            busy = obs.total_s - (ptoks or 0) / rate
            decode = out / busy if busy > 0 else None
            # An expected prefill close to the whole time leaves a sliver: no speed, not a
            # speed past any hardware's (its square in the spread overflowed to inf).
            decode = decode if decode is not None and decode <= max_decode else None
        changed = False
        if decode is not None and out is not None and out >= _MIN_DECODE_TOKENS:
            changed = self._drifted(decode, min_samples)
            self.decode.add(decode)
            self.load.add(max(load, 0.0))
            if obs.context_tokens is not None:
                self.context.add(float(obs.context_tokens))
        if obs.draft_n is not None and obs.draft_n_accepted is not None:
            self.drafted += obs.draft_n
            self.accepted += min(obs.draft_n_accepted, obs.draft_n)
            self.acc_w += 1.0
            self.acc_n += 1.0
        return changed

    def _drifted(self, decode: float, min_samples: int) -> bool:
        mean = self.decode.value()
        if self.decode.n < min_samples or mean is None or mean <= 0 or decode <= 0:
            return False
        step = math.log(decode / mean)
        self.drift_up = max(0.0, self.drift_up + step - CHANGE_SLACK)
        self.drift_down = max(0.0, self.drift_down - step - CHANGE_SLACK)
        return max(self.drift_up, self.drift_down) > CHANGE_LIMIT

    def forget(self) -> None:
        """Keep one observation's weight of everything and no trust: the class explores again,
        and its next observations outweigh what it learned before the change."""
        for mean in (self.decode, self.prefill, self.output, self.load, self.context):
            mean.w, mean.n = min(mean.w, 1.0), 0.0
        if self.acc_w > 1.0:
            self.drafted, self.accepted = self.drafted / self.acc_w, self.accepted / self.acc_w
            self.acc_w = 1.0
        self.acc_n = 0.0
        self.drift_up = self.drift_down = 0.0
        self.est = None

    def estimate(self, min_samples: int) -> Estimate:
        if self.est is None:
            self.est = Estimate(
                samples=self.decode.w,
                count=int(self.decode.n),
                decode_tok_s=self.decode.value(),
                decode_sd=self.decode.sd,
                acceptance=self.accepted / self.drafted if self.drafted > 0 else None,
                acceptance_samples=self.acc_w,
                acceptance_count=int(self.acc_n),
                prefill_tok_s=self.prefill.value(),
                output_tokens=self.output.value(),
                trusted=self.decode.n >= min_samples,
                decode_load=self.load.value() or 0.0,
                context_tokens=self.context.value(),
            )
        return self.est

    def to_json(self) -> dict[str, Any]:
        return {
            "decode": [self.decode.w, self.decode.m, self.decode.m2, self.decode.n],
            "prefill": [self.prefill.w, self.prefill.m, self.prefill.m2, self.prefill.n],
            "output": [self.output.w, self.output.m, self.output.m2, self.output.n],
            "acceptance": [self.acc_w, self.drafted, self.accepted, self.acc_n],
            "load": [self.load.w, self.load.m, self.load.m2, self.load.n],
            "context": [self.context.w, self.context.m, self.context.m2, self.context.n],
        }

    def to_sums(self) -> dict[str, list[float]]:
        """The cell as additive statistics (weight, sum, sum of squares, count): two boxes'
        cells merge by adding them (proxy.routing.priors)."""
        sums = {
            key: [mean.w, mean.w * mean.m, mean.w * mean.m2, mean.n]
            for key, mean in (
                ("decode", self.decode),
                ("prefill", self.prefill),
                ("output", self.output),
                ("load", self.load),
                ("context", self.context),
            )
        }
        return {**sums, "acceptance": [self.acc_w, self.drafted, self.accepted, self.acc_n]}

    @classmethod
    def from_sums(cls, sums: dict[str, list[float]], weight: float, min_samples: int) -> _Cell:
        """A prior: the merged sums' means, weighing ``weight`` of this box's own requests,
        trusted once the sums hold ``min_samples`` requests (so the policy uses it at once)."""
        cell = cls()
        for key in ("decode", "prefill", "output", "load", "context"):
            w, total, squares, n = sums[key]
            if w > 0:
                mean = _Mean(weight, total / w, squares / w, min(n, float(min_samples)))
                setattr(cell, key, mean)
        acc_w, drafted, accepted, acc_n = sums["acceptance"]
        if acc_w > 0:
            scale = weight / acc_w
            cell.acc_w, cell.drafted, cell.accepted = weight, drafted * scale, accepted * scale
            cell.acc_n = min(acc_n, float(min_samples))
        return cell

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Cell:
        cell = cls()
        cell.decode, cell.prefill, cell.output = (
            _Mean(*_floats(data[key], 4)) for key in ("decode", "prefill", "output")
        )
        cell.acc_w, cell.drafted, cell.accepted, cell.acc_n = _floats(data["acceptance"], 4)
        if "load" in data:  # files written before the load was kept: measured as if idle
            cell.load = _Mean(*_floats(data["load"], 4))
        if "context" in data:  # files written before the context was kept: no trend from it
            cell.context = _Mean(*_floats(data["context"], 4))
        return cell


def _floats(value: object, n: int) -> list[float]:
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"expected a list of {n} numbers")
    out = [float(x) for x in value]
    if not all(math.isfinite(x) and x >= 0 for x in out):
        raise ValueError("negative or non-finite number")
    return out


class TokenCalibrator:
    """Per-model chars-per-token ratio, learned online from the backends' token counts.

    Ratio of one request = prompt_chars / text tokens, where text tokens = context tokens
    reported by the backend (prompt_n + cache_n, or usage) minus the exactly known parts (token
    ids, images) and the chat template's tokens per message.

    Every client shares it, so no client may steer it: a request's ratio is clamped to a
    plausible range, and one request moves the estimate by at most `_MAX_STEP` (1%), however
    odd its text. An EWMA (in log space) follows slow drift; ten crafted requests move the
    estimate by under 10%.
    """

    _MIN_TOKENS = 64  # below this the template overhead dominates the ratio
    _BOUNDS = (1.0, 12.0)
    _MAX_STEP = math.log(1.01)

    def __init__(self, default: float, half_life: float) -> None:
        self._default = default
        self._decay = 0.5 ** (1.0 / half_life)
        self._ratios: dict[str, tuple[float, float]] = {}  # model -> (ratio, weight)

    def chars_per_token(self, model: str) -> float:
        entry = self._ratios.get(model)
        return entry[0] if entry is not None else self._default

    def observe(self, features: RequestFeatures, context_tokens: int) -> None:
        text_tokens = context_tokens - features.token_ids - features.images * IMAGE_TOKENS
        text_tokens -= features.messages * TEMPLATE_TOKENS_PER_MESSAGE
        if text_tokens < self._MIN_TOKENS or features.prompt_chars < self._MIN_TOKENS:
            return
        ratio = min(max(features.prompt_chars / text_tokens, self._BOUNDS[0]), self._BOUNDS[1])
        value, weight = self._ratios.get(features.model, (self._default, 0.0))
        weight = weight * self._decay + 1.0
        step = math.log(ratio / value) / weight
        step = min(max(step, -self._MAX_STEP), self._MAX_STEP)
        self._ratios[features.model] = (value * math.exp(step), weight)

    def to_json(self) -> dict[str, list[float]]:
        return {model: [r, w] for model, (r, w) in self._ratios.items()}

    def load_json(self, data: object) -> None:
        """Restore from ``to_json`` output; ignores anything malformed."""
        if not isinstance(data, dict):
            return
        lo, hi = self._BOUNDS
        for model, entry in data.items():
            if (
                isinstance(model, str)
                and isinstance(entry, list)
                and len(entry) == 2
                and all(isinstance(x, int | float) for x in entry)
                and lo <= entry[0] <= hi
                and entry[1] > 0
            ):
                self._ratios[model] = (float(entry[0]), float(entry[1]))


class LearnedStats:
    """Per (model, class, profile) estimates; one instance per app, fed by observations.

    ``model`` keeps two models served under the same profile names apart; a single-model
    deployment can leave it at its default "".
    """

    def __init__(self, settings: RoutingSettings) -> None:
        self._settings = settings
        self._decay = decay_factor(settings.half_life_samples)
        # (model, class, load level) -> profile -> cell. Level 0: the pool, where load is a
        # number kept in the cell; one process keys its cells by load level instead.
        self._cells: dict[tuple[str, RequestClass, int], dict[str, _Cell]] = {}
        self.busy: dict[str, BusyDepths] = {}
        """One process (backend name) -> its busy epochs and what it measured there."""
        self.calibrations: dict[str, Calibration] = {}
        """Start-up calibrations by key (binary, model, flags: proxy.routing.calibrate)."""
        self._recent: dict[tuple[str, str, int], dict[str, deque[tuple[float, float]]]] = {}
        self.changes: list[dict[str, object]] = []
        """The last classes whose speed moved far from what they had learned (``observe``)."""
        self.calibrator = TokenCalibrator(
            settings.chars_per_token, settings.chars_per_token_half_life
        )
        self.load_report = "new"
        self.keys: dict[str, dict[str, str]] = {}
        """Model -> what its cells were learned on (proxy.routing.priors.LearnedKey)."""
        self.priors: dict[str, Any] = {}
        """Merged exports of other boxes (proxy.routing.priors): seeds for cells not learned."""

    def observe(
        self,
        cls: RequestClass,
        profile: str,
        obs: Observation,
        *,
        model: str = "",
        load: float = 0.0,
        level: int = 0,
    ) -> None:
        """Add one observation; ``load``: other requests on its backend meanwhile (mean);
        ``level``: its load level on one process (0: a pool backend)."""
        cells = self._cells.setdefault((model, cls, level), {})
        cell = cells.setdefault(profile, _Cell())
        speed, out = obs.decode_tok_s, obs.output_tokens
        if level and speed and obs.context_tokens and out and out >= _MIN_DECODE_TOKENS:
            by_profile = self._recent.setdefault((model, cls.kind, level), {})
            recent = by_profile.setdefault(profile, deque(maxlen=RECENT_POINTS))
            recent.append((float(obs.context_tokens), speed))
        learned = cell.decode.value()
        settings = self._settings
        changed = cell.observe(
            obs,
            self._decay,
            settings.prior_prefill_tok_s,
            load,
            settings.min_samples,
            settings.max_decode_tok_s,
        )
        if changed and settings.change_detection:
            for each in cells.values():
                each.forget()
            # Beside others a process runs its busy epoch's depth, not the class's choice: the
            # reset cells are not read there, and the busy speeds it compares depths by, decayed
            # over half_life_samples, would keep the process at the old depth (docs/routing.md,
            # "Change detection"). They follow the change too.
            busy = self.busy.get(obs.backend) if level else None
            if busy is not None:
                busy.forget(cls.label, level, profile)
            change: dict[str, object] = {
                "model": model,
                "class": cls.label + (f"@{level}" if level else ""),
                "profile": profile,
                "learned_tok_s": _round(learned),
                "measured_tok_s": _round(obs.decode_tok_s),
            }
            self.changes = [*self.changes[-(_MAX_CHANGES - 1) :], change]
            structlog.get_logger("proxy.routing.stats").info("class_changed", **change)

    def estimate(
        self, cls: RequestClass, profile: str, *, model: str = "", level: int = 0
    ) -> Estimate | None:
        """The estimate, or None while it is below min_samples (not trusted)."""
        cell = self._cells.get((model, cls, level), {}).get(profile)
        if cell is None:
            return None
        est = cell.estimate(self._settings.min_samples)
        return est if est.trusted else None

    def view(self, cls: RequestClass, model: str = "", level: int = 0) -> dict[str, Estimate]:
        """Every profile with data in this class (and load level), trusted or not."""
        min_samples = self._settings.min_samples
        cells = self._cells.get((model, cls, level), {})
        return {p: c.estimate(min_samples) for p, c in cells.items()}

    def learned_acceptance(self, cls: RequestClass, profile: str, model: str = "") -> float | None:
        """A class's trusted acceptance at a profile, drafted-token weighted over load levels;
        None before min_samples drafted requests."""
        drafted = accepted = count = 0.0
        for level in (0, *self._settings.concurrency_levels):
            cell = self._cells.get((model, cls, level), {}).get(profile)
            if cell is not None:
                drafted, accepted, count = (
                    drafted + cell.drafted,
                    accepted + cell.accepted,
                    count + cell.acc_n,
                )
        if count < self._settings.min_samples or drafted <= 0:
            return None
        return accepted / drafted

    def recent(
        self, kind: str, level: int, model: str = ""
    ) -> dict[str, list[tuple[float, float]]]:
        """Per profile, the last requests' (context tokens, decode tok/s) of a content kind at
        a load level of one process, oldest first."""
        by_profile = self._recent.get((model, kind, level), {})
        return {profile: list(points) for profile, points in by_profile.items()}

    def additive_rows(self) -> list[dict[str, Any]]:
        """Every cell as additive statistics, keyed like the learned file's rows."""
        return [
            {"model": m, "bucket": c.bucket, "kind": c.kind, "level": lv, "profile": p}
            | cell.to_sums()
            for (m, c, lv), by_profile in self._cells.items()
            for p, cell in by_profile.items()
        ]

    def forget_model(self, model: str) -> int:
        """Drop what ``model`` learned (its key changed: proxy.routing.priors); cells dropped."""
        gone = [key for key in self._cells if key[0] == model]
        dropped = sum(len(self._cells.pop(key)) for key in gone)
        for key in [key for key in self._recent if key[0] == model]:
            del self._recent[key]
        return dropped

    def seed(self, rows: list[dict[str, Any]], weight: float) -> int:
        """Cells not learned here start from these priors (rows of ``additive_rows``' shape,
        checked by proxy.routing.priors); a cell this box learned keeps its own. Seeded count."""
        labels = set(bucket_labels(self._settings.context_buckets))
        levels = {0, *self._settings.concurrency_levels}
        seeded = 0
        for row in rows:
            if row["bucket"] not in labels or row["level"] not in levels:
                continue  # bucket bounds or load levels changed since it was exported
            key = (row["model"], RequestClass(row["bucket"], row["kind"]), row["level"])
            cells = self._cells.setdefault(key, {})
            if row["profile"] not in cells:
                cells[row["profile"]] = _Cell.from_sums(row, weight, self._settings.min_samples)
                seeded += 1
        return seeded

    def for_model(self, model: str) -> ModelStats:
        """The policy's StatsView of one model."""
        return ModelStats(self, model)

    def table(self) -> list[dict[str, object]]:
        """Rows for GET /admin/routing and the metrics gauges."""
        rows: list[dict[str, object]] = []
        for model, cls, level in sorted(self._cells):
            for profile, est in sorted(self.view(cls, model, level).items()):
                rows.append(
                    {
                        "model": model,
                        # "@N": measured with N or more requests decoding on one process
                        "class": cls.label + (f"@{level}" if level else ""),
                        "level": level,
                        "bucket": cls.bucket,
                        "kind": cls.kind,
                        "profile": profile,
                        "samples": est.count,
                        "weight": round(est.samples, 2),
                        "trusted": est.trusted,
                        "decode_tok_s": _round(est.decode_tok_s),
                        "decode_sd": round(est.decode_sd, 2),
                        "acceptance": _round(est.acceptance, 4),
                        "acceptance_samples": est.acceptance_count,
                        "prefill_tok_s": _round(est.prefill_tok_s),
                        "output_tokens": _round(est.output_tokens, 1),
                        "decode_load": round(est.decode_load, 2),
                    }
                )
        return rows

    # --- persistence -------------------------------------------------------------------

    def dumps(self) -> bytes:
        """Serialize the whole state at once (for a caller off the event loop: see
        ``dump_stepwise`` for one on it)."""
        return b"".join(piece for piece in self.dump_pieces(_DUMP_STEP) if piece is not None)

    def dump_pieces(self, step: int) -> Iterator[bytes | None]:
        """The state's JSON in pieces, `step` cells or busy rows at a time, with None between
        two steps: where a caller on the event loop lets it run (``dump_stepwise``). The cells
        and backends are those of the moment each part begins; a cell's numbers those of the
        moment it is written."""
        yield b'{"version":%d,"buckets":%s,"cells":[' % (
            _STATE_VERSION,
            _compact(self._settings.context_buckets),
        )
        cells = [
            (model, cls, level, profile, cell)
            for (model, cls, level), by_profile in list(self._cells.items())
            for profile, cell in list(by_profile.items())
        ]
        for start in range(0, len(cells), step):
            rows = [_cell_row(*entry) for entry in cells[start : start + step]]
            yield (b"," if start else b"") + _compact(rows)[1:-1]
            yield None
        yield b'],"chars_per_token":%s,"busy":{' % _compact(self.calibrator.to_json())
        for n, (name, busy) in enumerate(sorted(list(self.busy.items()))):
            rows = busy.to_json()
            yield (b"," if n else b"") + _compact(name) + b":["
            for start in range(0, len(rows), step):
                yield (b"," if start else b"") + _compact(rows[start : start + step])[1:-1]
                yield None
            yield b"]"
        yield b'},"calibrations":%s,"keys":%s,"priors":%s}' % (
            _compact({key: c.to_json() for key, c in sorted(self.calibrations.items())}),
            _compact(self.keys),
            _compact(self.priors),
        )

    def save(self, path: Path) -> None:
        write_atomic(path, self.dumps())

    @classmethod
    def load(cls, path: Path, settings: RoutingSettings) -> LearnedStats:
        """Load the learned file, keeping what can be trusted of it: a cell, busy row or
        calibration that is not one (a number negative or not finite, a field missing) is
        dropped alone, and the log says which and why. A file not read whole (unreadable, or
        cells dropped so) is kept as ``<name>.rejected`` first: the next save writes over it.
        ``load_report`` says what happened."""
        stats = cls(settings)
        log = structlog.get_logger("proxy.routing.stats").bind(path=str(path))
        raw: bytes | None = None
        try:
            raw = read_local_file(path, _MAX_STATE_BYTES)
            state = json.loads(raw)
            if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
                raise ValueError("not a learned file of version 1")
        except FileNotFoundError:
            stats.load_report = "missing: starting empty"
            log.info("stats_state_missing")
            return stats
        except (OSError, ValueError, RecursionError) as exc:
            kept = keep_rejected(path, raw)
            stats.load_report = f"unreadable ({exc}): starting empty{_kept_words(kept)}"
            log.warning("stats_state_unreadable", error=str(exc), kept=_kept_path(kept))
            return stats
        kept_cells, stale, untrusted = stats._restore(state)
        dropped = stale + len(untrusted)
        stats.load_report = f"loaded {kept_cells} cells" + (
            f", dropped {dropped}" if dropped else ""
        )
        if untrusted:
            kept = keep_rejected(path, raw)
            stats.load_report += f" ({len(untrusted)} untrusted{_kept_words(kept)})"
            log.warning(
                "stats_state_cells_dropped",
                dropped=untrusted[:_MAX_REASONS],
                untrusted=len(untrusted),
                kept=_kept_path(kept),
            )
        log.info("stats_state_loaded", cells=kept_cells, dropped=dropped)
        return stats

    def _restore(self, state: dict[str, Any]) -> tuple[int, int, list[str]]:
        """(cells kept, parts dropped because the settings changed since, untrusted parts:
        where and why, one line each)."""
        untrusted: list[str] = []
        kept, stale = self._restore_cells(state.get("cells"), untrusted)
        self.calibrator.load_json(state.get("chars_per_token"))
        stale += self._restore_busy(state.get("busy", {}), untrusted)  # files from before: none
        self._restore_keys(state, untrusted)  # files from before: none
        calibrations = state.get("calibrations", {})  # files from before: none
        for key, data in _items(calibrations, "calibrations", untrusted):
            try:
                self.calibrations[str(key)] = Calibration.from_json(data)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                untrusted.append(f"calibration {key}: {_why(exc)}")
        return kept, stale, untrusted

    def _restore_keys(self, state: dict[str, Any], untrusted: list[str]) -> None:
        keys = state.get("keys", {})
        for model, key in _items(keys, "keys", untrusted):
            if isinstance(key, dict) and all(isinstance(v, str) for v in key.values()):
                self.keys[str(model)] = {str(k): v for k, v in key.items()}
            else:
                untrusted.append(f"keys {model}: not an object of strings")
        priors = state.get("priors", {})
        if isinstance(priors, dict):
            self.priors = priors  # checked where it is used (proxy.routing.priors.adopt)
        else:
            untrusted.append("priors: not an object")

    def _restore_cells(self, rows: object, untrusted: list[str]) -> tuple[int, int]:
        labels = set(bucket_labels(self._settings.context_buckets))
        levels = {0, *self._settings.concurrency_levels}
        if not isinstance(rows, list):
            untrusted.append("cells: not a list")
            return 0, 0
        kept = stale = 0
        for row in rows:
            try:
                level = row.get("level", 0)  # files written before load levels: pool cells
                if row["bucket"] not in labels or row["kind"] not in ("code", "prose"):
                    stale += 1  # bucket bounds changed since the file was written
                    continue
                if level not in levels:
                    stale += 1  # concurrency levels changed since the file was written
                    continue
                cls = RequestClass(str(row["bucket"]), row["kind"])
                key = (str(row.get("model", "")), cls, int(level))
                profile, cell = str(row["profile"]), _Cell.from_json(row)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                untrusted.append(f"cell {_where(row)}: {_why(exc)}")
                continue
            self._cells.setdefault(key, {})[profile] = cell
            kept += 1
        return kept, stale

    def _restore_busy(self, busy: object, untrusted: list[str]) -> int:
        """Each process's busy measurements, row by row; the rows dropped as stale."""
        class_labels = {
            RequestClass(b, k).label
            for b in bucket_labels(self._settings.context_buckets)
            for k in ("code", "prose")
        }
        stale = 0
        for name, rows in _items(busy, "busy", untrusted):
            if not isinstance(rows, list):
                untrusted.append(f"busy {name}: not a list")
                continue
            kept = self.busy[str(name)] = BusyDepths()
            for n, row in enumerate(rows):
                try:
                    one, lost = BusyDepths.from_json([row], class_labels)
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    untrusted.append(f"busy {name}[{n}]: {_why(exc)}")
                    continue
                kept.speeds.update(one.speeds)
                stale += lost
        return stale


def keep_rejected(path: Path, raw: bytes | None) -> Path | None:
    """Keep a learned file that was not read whole as ``<name>.rejected`` beside it, before the
    next save writes over it: its bytes when they were read, else the file itself, moved aside
    (a regular file only: never a FIFO or a device). None when there is nothing to keep or it
    cannot be kept (then the log says only why it was not read)."""
    rejected = path.with_name(path.name + ".rejected")
    try:
        if raw is not None:
            write_atomic(rejected, raw)
        elif path.is_file():
            os.replace(path, rejected)
        else:
            return None
    except OSError:
        return None
    return rejected


def _items(value: object, what: str, untrusted: list[str]) -> list[tuple[Any, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    untrusted.append(f"{what}: not an object")
    return []


def _where(row: object) -> str:
    if not isinstance(row, dict):
        return repr(row)[:80]
    parts = (row.get(k) for k in ("model", "bucket", "kind", "profile"))
    return "/".join(str(p) for p in parts if p not in (None, "")) + f"@{row.get('level', 0)}"


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def _kept_words(kept: Path | None) -> str:
    return "" if kept is None else f"; kept as {kept}"


def _kept_path(kept: Path | None) -> str | None:
    return None if kept is None else str(kept)


@dataclass(frozen=True, slots=True)
class ModelStats:
    """LearnedStats bound to one model: what ``policy.decide`` reads (its StatsView)."""

    stats: LearnedStats
    model: str

    def view(self, cls: RequestClass) -> dict[str, Estimate]:
        return self.stats.view(cls, self.model)

    def view_at(self, cls: RequestClass, level: int) -> dict[str, Estimate]:
        """One process's estimates at one load level (routing.depth)."""
        return self.stats.view(cls, self.model, level)

    def recent_at(self, kind: str, level: int) -> dict[str, list[tuple[float, float]]]:
        """The last requests of a kind at one load level, per profile (routing.depth)."""
        return self.stats.recent(kind, level, self.model)


async def dump_stepwise(stats: LearnedStats, step: int = _DUMP_STEP) -> bytes:
    """``stats.dumps()``, the same bytes, built on the event loop `step` rows at a time, letting
    it run in between: a large state (tens of thousands of cells took a second) no longer stalls
    every request at each save."""
    pieces: list[bytes] = []
    for piece in stats.dump_pieces(step):
        if piece is None:
            await asyncio.sleep(0)
        else:
            pieces.append(piece)
    return b"".join(pieces)


def _cell_row(
    model: str, cls: RequestClass, level: int, profile: str, cell: _Cell
) -> dict[str, Any]:
    return {
        "model": model,
        "bucket": cls.bucket,
        "kind": cls.kind,
        "profile": profile,
        "level": level,
        **cell.to_json(),
    }


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace (atomic on POSIX),
    and fsync the directory, so that the rename itself survives a power cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # not every file system lets a directory be synced
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

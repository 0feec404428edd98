"""The start-up calibration of a process serving per-request depths: a short, bounded measurement
over HTTP.

Run by the supervisor's ``before_ready`` hook (``proxy.app``): the backend is healthy and
probed (it honours ``"speculative.n_max"``) but not yet announced ready, so no client request
is on it. Why then and not later at a low priority: measuring with every slot decoding needs
every slot, and a client request beside the measurement would be slowed by it (a step that
mixes depths costs every slot an extra pass on hybrid models) and would spoil it; a measurement
that waits for an idle process may never run on a busy box. The cost is paid once per binary,
model and flags: the result is kept in the learned file (``LearnedStats.calibrations``), so a
restart, or a crash and its successor, measure nothing. Clients that arrive meanwhile wait in
the model's queue, as they do while the model loads.

What it sends (``measure``): greedy completions of ``tokens`` tokens with ``ignore_eos``, at
depth 0 and at the deepest depth: alone (a code prompt, then a prose prompt), as a burst of two
(one of each) and as a burst that fills every slot (code and prose prompts alternately). The
same prompts at both depths, so each comparison is paired. Each request's decode speed comes
from its own timings (predicted_n / predicted_ms), as the learned statistics read them. Bounded
by ``timeout_s``; anything that goes wrong leaves the prior in place (``CalibrationFailed``) and
is tried again at the next start.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from proxy.config.routing import RoutingSettings
from proxy.routing.calibration import KINDS, Calibration, Cell, KindCell
from proxy.routing.stats import LearnedStats
from supervisor.completion import DEPTH_KEY, PATH, NoTimings, completion_timings

PROMPTS = (
    "Write a Python function that reads a CSV file of orders, groups them by customer and "
    "returns the total per customer, with type hints and a docstring.\n\n```python\n",
    "Tell me the story of a lighthouse keeper on a remote island who finds a message in a "
    "bottle, in the style of an old sea tale.\n\n",
)
"""A code prompt and a prose prompt: drafting pays differently on each (published-figures.md)."""

log = structlog.get_logger("proxy.calibration")


class CalibrationFailed(Exception):
    """The backend did not answer the measurement usefully; the message says how."""


@dataclass(frozen=True)
class Identity:
    """What a calibration is valid for: the binary, the model and the flags it was run with."""

    key: str
    binary: str
    model: str


def identity(argv: Sequence[str], url: str | None, model: str) -> Identity:
    """The calibration key of a backend: its binary (path, size, modification time), its model
    file (likewise, when ``-m`` names one) and its other flags; a remote backend by its URL and
    model name. A rebuilt binary, another model or another -np measures again."""
    if url is not None:
        parts: list[object] = ["remote", url, model]
        binary, model_id = url, model
    else:
        binary = shutil.which(argv[0]) or argv[0]
        model_path = _flag(argv, ("-m", "--model"))
        model_id = model_path or model
        parts = [_file_id(binary), _file_id(model_path) if model_path else model, list(argv[1:])]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return Identity(digest, binary, model_id)


def _flag(argv: Sequence[str], names: tuple[str, ...]) -> str | None:
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _file_id(path: str) -> list[object]:
    try:
        info = os.stat(path)
    except OSError:
        return [path]
    return [os.path.realpath(path), info.st_size, info.st_mtime_ns]


@dataclass(frozen=True)
class _Answer:
    tok_s: float
    drafted: int
    accepted: int
    backend_ms: float
    context: float  # prompt tokens + half the answer: where on the context axis it decoded


async def _complete(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, depth: int, tokens: int
) -> _Answer:
    body: dict[str, Any] = {
        DEPTH_KEY: depth,
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": False,
    }
    what = f"{PATH} at depth {depth}"
    try:
        timings = await completion_timings(session, url, body, what)
    except NoTimings as exc:
        raise CalibrationFailed(str(exc)) from None
    try:
        n, ms = int(timings["predicted_n"]), float(timings["predicted_ms"])
        drafted = int(timings.get("draft_n") or 0)
        accepted = int(timings.get("draft_n_accepted") or 0)
        prompt_ms = float(timings.get("prompt_ms") or 0.0)
        context = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
    except (ValueError, KeyError, TypeError):
        raise CalibrationFailed(f"{what}: the answer has no usable timings") from None
    if n < 2 or ms <= 0:
        raise CalibrationFailed(f"{what}: decoded {n} tokens in {ms} ms")
    return _Answer(1e3 * n / ms, drafted, accepted, prompt_ms + ms, context + n / 2)


async def _burst(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    depth: int,
    load: int,
    tokens: int,
    kinds: list[KindCell],
) -> tuple[Cell, float]:
    """``load`` requests at once (alone: the code prompt, then the prose prompt, one after the
    other), each also kept by its kind in ``kinds``; the cell and the backend time it took."""
    if load == 1:
        answers = [
            await _complete(session, url, model, prompt, depth, tokens) for prompt in PROMPTS
        ]
        backend_ms = sum(a.backend_ms for a in answers)
    else:
        prompts = [f"{PROMPTS[i % 2]}#{i}\n" for i in range(load)]
        answers = list(
            await asyncio.gather(
                *(_complete(session, url, model, p, depth, tokens) for p in prompts)
            )
        )
        backend_ms = max(a.backend_ms for a in answers)
    for i, answer in enumerate(answers):
        kinds.append(KindCell(KINDS[i % 2], depth, answer.tok_s, answer.context, load))
    drafted = sum(a.drafted for a in answers)
    acceptance = sum(a.accepted for a in answers) / drafted if drafted else None
    tok_s = sum(a.tok_s for a in answers) / len(answers)
    return Cell(load, depth, tok_s, len(answers), acceptance), backend_ms / 1e3


def measured_loads(slots: int) -> list[int]:
    """Alone, two decoding, and every slot decoding."""
    return sorted({1, min(2, slots), slots})


async def measure(
    session: aiohttp.ClientSession,
    url: str,
    *,
    model: str,
    ident: Identity,
    deepest: int,
    slots: int,
    tokens: int,
    timeout_s: float,
) -> Calibration:
    """Depth 0 and ``deepest``, alone and with every slot decoding (see the module docstring)."""
    started, wall = time.time(), time.monotonic()
    cells: list[Cell] = []
    kinds: list[KindCell] = []
    backend_s = 0.0
    loads = measured_loads(slots)
    try:
        async with asyncio.timeout(timeout_s):
            for load in loads:
                for depth in (0, deepest):
                    cell, spent = await _burst(session, url, model, depth, load, tokens, kinds)
                    cells.append(cell)
                    backend_s += spent
    except TimeoutError:
        raise CalibrationFailed(f"not done within {timeout_s:g}s") from None
    for cell in cells:
        if cell.depth == 0 and cell.acceptance is not None:
            raise CalibrationFailed(f"drafted at depth 0 ({DEPTH_KEY} ignored?)")
    return Calibration(
        key=ident.key,
        binary=ident.binary,
        model=ident.model,
        slots=slots,
        cells=tuple(cells),
        wall_s=time.monotonic() - wall,
        backend_s=backend_s,
        measured_at=started,
        tokens=tokens,
        alone_kinds=tuple(k for k in kinds if k.load == 1),
        busy_kinds=tuple(k for k in kinds if k.load > 1),
    )


@dataclass(frozen=True)
class Target:
    """The backend to calibrate, as the app knows it."""

    name: str
    model: str
    url: str
    argv: Sequence[str]
    remote_url: str | None
    slots: int
    depths: Mapping[str, int]


class Calibrator:
    """Runs (or finds in the learned file) the calibration of each process serving per-request
    depths before it is announced ready, and tells the router which applies to which backend."""

    def __init__(
        self,
        settings: RoutingSettings,
        stats: LearnedStats,
        calibrated: dict[str, Calibration],
        session: Callable[[], aiohttp.ClientSession],
        save: Callable[[], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._stats = stats
        self._calibrated = calibrated
        self._session = session
        self._save = save

    async def run(self, target: Target) -> Calibration | None:
        """The calibration that now applies to ``target`` (None: the prior stays)."""
        settings = self._settings
        deepest = max(target.depths.values(), default=0)
        if settings.calibrate == "off" or deepest == 0:
            return None
        ident = identity(target.argv, target.remote_url, target.model)
        cached = self._stats.calibrations.get(ident.key)
        bound = log.bind(backend=target.name, model=target.model, key=ident.key)
        if cached is not None and cached.slots == target.slots and cached.deepest == deepest:
            if cached.covers(measured_loads(target.slots)):
                self._calibrated[target.name] = cached
                levels = cached.findings(settings.concurrency_levels)
                bound.info("calibration_cached", levels=levels)
                return cached
            bound.info("calibration_outdated", loads=cached.loads, kinds=bool(cached.busy_kinds))
        bound.info(
            "calibrating", slots=target.slots, deepest=deepest, tokens=settings.calibration_tokens
        )
        try:
            found = await measure(
                self._session(),
                target.url,
                model=target.model,
                ident=ident,
                deepest=deepest,
                slots=target.slots,
                tokens=settings.calibration_tokens,
                timeout_s=settings.calibration_timeout_s,
            )
        except CalibrationFailed as exc:
            bound.warning("calibration_failed", error=str(exc), kept="the prior")
            return None
        self._stats.calibrations[ident.key] = found
        self._calibrated[target.name] = found
        bound.info(
            "calibrated",
            wall_s=round(found.wall_s, 2),
            backend_s=round(found.backend_s, 2),
            levels=found.findings(settings.concurrency_levels),
            speeds={f"{c.load}@{c.depth}": round(c.tok_s, 2) for c in found.cells},
        )
        await self._save()
        return found

"""The depth a busy process runs at, learned from what it achieved there at each depth.

While a process is busy, every request admitted beside others gets the depth of the current
*epoch* (``busy_epoch_admissions`` admissions), and a request keeps the depth it was admitted
at. Each epoch's depth (``next_busy_depth``) is the cold depth or the other one (the deepest, or
the shallowest when the cold depth is the deepest: the router's choice):

1. cold: ``cold_busy_role`` (or the router's calibrated pick, held once the process compared
   the two: ``held_cold``) until the process has ``min_samples`` measured requests there,
   unless the other depth is already likely faster on what both measured (2.);
2. then the other depth while it is likely faster: entered above ``ENTER``, left below ``STAY``;
3. while the comparison is open (a chance between ``DROP`` and ``ENTER`` on fewer than
   ``DECIDED`` x ``min_samples`` requests), an exploring epoch at the other depth
   (``Epoch.exploring``), only on an idle process (``calm``) and not while half an epoch of its
   requests is still out; below ``DROP`` it is not measured again.

What a depth achieved (``BusyDepths``): the log decode speed of the requests that ran at it
while the process was busy at that depth only, each weighted by how long it ran so (the live
backend's single-depth clock), per cell (class label, load level, profile). A comparison
(``BusyDepths.gap``) counts each class by its share of the time at the two depths and its
certainty in requests, not seconds; a class measured at the reference depth only counts at the
measured classes' gap shrunk toward ``PRIOR_GAP``.

``BusyEpochs`` keeps the epochs of every process: it picks the next epoch's depth where requests
are routed, counts each admission into an epoch once, while the request runs, and turns a finished
request's run (``depth_clock.DepthRecord``) into a speed at its depth. The rules above are pure:
the state is data, the choice is a function of it. Why each rule, and what it was measured to do:
docs/routing.md ("Busy epochs").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from proxy.config.routing import RoutingSettings, decay_factor
from proxy.routing.calibration import Calibration
from proxy.routing.classes import RequestClass, bucket_contexts, load_level
from proxy.routing.depth_clock import DepthRecord
from proxy.routing.features import RequestFeatures
from proxy.routing.load import RecentLoad

ENTER = 0.8
"""Probability that the deepest depth is faster, above which a cold process moves to it."""
STAY = 0.5
"""... below which a process at the deepest depth goes back."""
DROP = 0.2
"""... and below which a process at the cold depth stops measuring the deepest one; between
the two, it measures it again (one epoch at a time) until the comparison rests on ``DECIDED``
times ``min_samples`` requests: an early comparison rests on a few requests of a few classes."""
DECIDED = 2
MAX_STORED = 1e30
"""The largest number a saved state may hold: far past any real measurement, and small enough
that no arithmetic on it overflows a float (a finite 1e308 weight did: every routing decision
raised, every request answered 500)."""
MIN_SD = 0.15
"""Floor of a class's log-speed spread: a few similar requests must not look certain."""
PRIOR_GAP = math.log(0.75)
"""What a class not yet measured at the other depth is taken to lose there, in log speed: the
published llama.cpp runs with 2-4 parallel requests (-22 % at 2, -30 % at 4, -19 % at 4 on
another GPU: docs/published-figures.md#concurrency). A prior, not evidence: it moves the mean,
not the count of requests."""
PRIOR_SD = 0.3
PRIOR_REQUESTS = 3.0
"""How many requests' worth of evidence the prior is: a class not yet measured at the other
depth is taken to differ as the measured ones do, shrunk toward ``PRIOR_GAP`` by this."""


Prior = Callable[[str, int], "float | None"]
"""A prior gap per (class label, load level), or None for the published ``PRIOR_GAP``."""


@dataclass(slots=True)
class LogSpeed:
    """A decayed, weighted mean and spread of log decode speeds, and how many requests' worth of
    evidence they are."""

    weight: float = 0.0
    weight2: float = 0.0
    """The sum of the squared weights (decayed alike): for ``requests``."""
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float, weight: float, decay: float) -> None:
        self.weight = self.weight * decay + weight
        self.weight2 = self.weight2 * decay**2 + weight**2
        self.m2 *= decay
        delta = value - self.mean
        self.mean += weight * delta / self.weight
        self.m2 += weight * delta * (value - self.mean)

    @property
    def requests(self) -> float:
        """The effective number of requests behind the mean (Kish): a long run weighs more in
        the mean, but it is still one request's speed, not several."""
        return self.weight**2 / self.weight2 if self.weight2 > 0 else 0.0

    @property
    def sd(self) -> float:
        # max: rounding can leave m2 a hair below zero
        return math.sqrt(max(self.m2, 0.0) / self.weight) if self.requests > 1.0 else math.inf


@dataclass(frozen=True, slots=True)
class Gap:
    """How much faster one depth decodes than another, in log speed, over the classes both
    ran in: their mean difference weighted by each class's share of the decode time, its
    standard error, and how many requests' worth of evidence it rests on."""

    mean: float
    se: float
    weight: float

    @property
    def chance_faster(self) -> float:
        """The probability that the first depth is the faster one (normal approximation)."""
        if self.weight <= 0:
            return 0.5
        return 0.5 * (1.0 + math.erf(self.mean / self.se / math.sqrt(2.0)))


@dataclass(slots=True)
class BusyDepths:
    """One process: the epoch it is in and what it measured at each depth while busy."""

    profile: str | None = None
    """The depth of the current epoch; None before the process was first busy."""
    left: int = 0
    """Admissions left in the current epoch."""
    speeds: dict[tuple[str, int, str], LogSpeed] = field(default_factory=dict)
    """(class label, load level, profile) -> log decode speed while busy at that profile only."""
    sent: Counter[str] = field(default_factory=Counter)
    """Busy admissions per profile."""
    finished: Counter[str] = field(default_factory=Counter)
    """... and how many of them have finished (learned from or not)."""
    exploring: bool = False
    """Whether the current epoch explores (``Epoch.exploring``)."""
    cold: str | None = None
    """The cold depth the current epoch was chosen against (the router's pick)."""

    def observe(
        self,
        cls: RequestClass,
        level: int,
        profile: str,
        decode_tok_s: float,
        seconds: float,
        decay: float,
    ) -> None:
        """A request at ``profile`` that decoded at ``decode_tok_s`` on average, ``seconds`` of
        it while the process was busy at ``profile`` only, with ``level`` requests decoding
        then (a load level: ``classes.load_level``)."""
        if decode_tok_s > 0 and seconds > 0:
            cell = self.speeds.setdefault((cls.label, level, profile), LogSpeed())
            cell.add(math.log(decode_tok_s), seconds, decay)

    def forget(self, label: str, level: int, profile: str) -> None:
        """A class whose speed at ``profile`` changed at ``level`` (``LearnedStats.observe``):
        those speeds keep their mean at one request's weight, so its next requests outweigh
        them. Its speeds at the other depths, not seen to move, stay: they are what the changed
        depth is compared with, and their time is the class's share of the comparison (``gap``;
        dropped too, the class would weigh one request there and the others would decide)."""
        speed = self.speeds.get((label, level, profile))
        if speed is not None and speed.requests > 1.0:
            one = speed.weight / speed.requests
            speed.m2 *= one / speed.weight
            speed.weight, speed.weight2 = one, one * one

    def samples(self, profile: str) -> float:
        """How many requests' worth of speeds the process has at ``profile``."""
        return sum(e.requests for (_, _, p), e in self.speeds.items() if p == profile)

    def outstanding(self, profile: str) -> int:
        return self.sent[profile] - self.finished[profile]

    def report(self) -> dict[str, object]:
        """For /admin/routing: the epoch, and per profile the samples and requests out."""
        return {
            "profile": self.profile,
            "left": self.left,
            "samples": {p: round(self.samples(p), 2) for p in sorted({k[2] for k in self.speeds})},
            "outstanding": {p: self.outstanding(p) for p in sorted(self.sent)},
        }

    def to_json(self) -> list[dict[str, object]]:
        """What it measured (the epoch and its counts are the running process's, not saved)."""
        return [
            {"class": label, "level": level, "profile": profile, **asdict(speed)}
            for (label, level, profile), speed in sorted(self.speeds.items())
        ]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]], labels: set[str]) -> tuple[BusyDepths, int]:
        """A saved state's measurements, and how many were dropped: a class label no longer
        in ``labels`` (the context buckets changed since the file was written), or a row of a
        file from before speeds were kept per load level."""
        state, dropped = cls(), 0
        for row in rows:
            if str(row["class"]) not in labels or "level" not in row:
                dropped += 1
                continue
            speed = LogSpeed(**{f.name: float(row[f.name]) for f in fields(LogSpeed)})
            if not (speed.weight > 0 and speed.weight2 > 0 and speed.m2 >= 0):
                raise ValueError(f"not a measurement: {row!r}")
            if not all(abs(getattr(speed, f.name)) <= MAX_STORED for f in fields(LogSpeed)):
                dropped += 1  # finite but absurd: its arithmetic would overflow
                continue
            state.speeds[(str(row["class"]), int(row["level"]), str(row["profile"]))] = speed
        return state, dropped

    def gap(self, profile: str, reference: str, priors: Prior | None = None) -> Gap:
        """``profile`` against ``reference``, class by class. Each class's difference counts by
        its share of the time measured at the two depths: what the process's throughput is
        made of (a few long agent prompts can take more of it than many short chats), where
        counting requests would let the short chats decide. How sure the mean is counts
        requests: each class's spread over the fewer of its two samples. A cell measured at
        ``reference`` only counts by its time there, at the measured cells' gap shrunk toward
        ``PRIOR_GAP`` (``PRIOR_REQUESTS``), with ``PRIOR_SD`` and no weight as evidence.
        ``priors``: per class label and load level, the gap the backend's start-up
        calibration implies there (``proxy.routing.calibration``), in place of ``PRIOR_GAP``."""
        measured: list[tuple[float, float, float, float]] = []
        unmeasured: list[tuple[float, str, int]] = []
        for (label, level, p), own in self.speeds.items():
            if p != reference:
                continue
            other = self.speeds.get((label, level, profile))
            if other is None:
                unmeasured.append((own.weight, label, level))
                continue
            n = min(own.requests, other.requests)
            spread = max((s for s in (own.sd, other.sd) if math.isfinite(s)), default=MIN_SD)
            row = (own.weight + other.weight, other.mean - own.mean, max(spread, MIN_SD), n)
            measured.append(row)
        evidence = sum(r[3] for r in measured)
        if evidence <= 0:
            return Gap(0.0, math.inf, 0.0)
        observed = sum(t * diff for t, diff, _, _ in measured) / sum(r[0] for r in measured)

        def guess(label: str, level: int) -> float:
            prior = priors(label, level) if priors is not None else None
            prior = PRIOR_GAP if prior is None else prior
            return (evidence * observed + PRIOR_REQUESTS * prior) / (evidence + PRIOR_REQUESTS)

        rows = measured + [(t, guess(lb, lv), PRIOR_SD, 0.0) for t, lb, lv in unmeasured]
        share = sum(r[0] for r in rows)
        mean = sum(t * diff for t, diff, _, _ in rows) / share
        variance = sum((t / share) ** 2 * sd**2 / max(n, 1.0) for t, _, sd, n in rows)
        return Gap(mean, math.sqrt(variance), evidence)


def held_cold(state: BusyDepths, pick: str) -> str:
    """The cold depth of the next epoch. The router's ``pick`` is the calibration's, carried to
    the context the process serves, so it moves with that context. Once the process has
    compared it with the cold depth of its current epoch, that one holds, and only the
    comparison moves the process, with its hysteresis (why: docs/routing.md, "Busy epochs")."""
    held = state.cold
    if held is None or held == pick or state.gap(pick, held).weight <= 0:
        return pick
    return held


@dataclass(frozen=True, slots=True)
class Epoch:
    """The depth of a busy epoch, and whether it explores: the deepest depth before it is
    known to be faster (left at ``ENTER``'s threshold, not ``STAY``'s)."""

    profile: str
    exploring: bool = False
    admissions: int | None = None
    """How many admissions it lasts; None: a whole epoch. The check of the calibration's guess
    is half of one: the guess is usually right, and every admission of the check runs at the
    depth it measured slower (docs/routing.md, "Start-up calibration")."""


def next_busy_depth(
    state: BusyDepths,
    cold: str,
    deep: str,
    min_samples: int,
    epoch: int,
    *,
    calm: bool = True,
    priors: Prior | None = None,
    confirm: bool = False,
) -> Epoch:
    """The next busy epoch: at ``cold`` or ``deep`` (see the module's docstring). ``calm``: the
    process is idle now, so an exploring epoch's requests soon have it to themselves.
    ``priors``: the calibrated gap of ``deep`` against ``cold`` per class and level (``gap``).
    ``confirm``: the cold depth is the calibration's guess from short prompts; the other one
    gets its first epoch, half of one (``Epoch.admissions``), as soon as the cold one has its
    samples, idle or not (a saturated process is seldom idle, and a wrong guess would otherwise
    hold for good)."""
    if cold == deep:
        return Epoch(cold)
    gap = state.gap(deep, cold, priors)
    chance = gap.chance_faster
    staying = state.profile == deep and not state.exploring
    if gap.weight >= min_samples / 2 and chance >= (STAY if staying else ENTER):
        # Even before the cold depth has its samples: the calibrated cold pick moves with the
        # context it is carried to, and can turn to a depth this process measured slower.
        return Epoch(deep)
    if state.samples(cold) < min_samples:
        return Epoch(cold)
    if confirm and state.sent[deep] == 0:
        return Epoch(deep, exploring=True, admissions=max(1, epoch // 2))
    still_open = chance > DROP and gap.weight < DECIDED * min_samples
    if still_open and calm and state.outstanding(deep) <= epoch / 2:
        return Epoch(deep, exploring=True)
    return Epoch(cold)


class BusyEpochs:
    """The busy epochs of the processes serving per-request depths (backend name -> its
    ``BusyDepths``, saved with what was learned: ``LearnedStats.busy``)."""

    def __init__(self, settings: RoutingSettings, states: dict[str, BusyDepths]) -> None:
        self.settings = settings
        self.states = states

    def depth(
        self,
        backend: str,
        depths: Mapping[str, int],
        slots: int,
        recent: RecentLoad,
        calibration: Calibration | None,
        features: RequestFeatures,
        *,
        calm: bool,
    ) -> str | None:
        """The depth of the backend's current busy epoch; the next epoch's once it ran out.

        Cold, the process starts at ``cold_busy_role``, or where its start-up calibration
        measured the faster depth at the load level it is busy at (its recent load: 2-3
        decoding or 4+), carried to the context and content it serves; when that is not
        ``cold_busy_role``, the other depth's first epoch comes as soon as the cold one has its
        samples, idle process or not. Once the process has compared the two depths the cold
        pick holds (``held_cold``). The calibration's gap carried to each class's context is
        the prior of the classes not yet run at the other depth."""
        state = self.states.setdefault(backend, BusyDepths())
        if state.profile is None or state.left <= 0 or calm:
            self._next_epoch(state, depths, slots, recent, calibration, features, calm=calm)
        return state.profile

    def _next_epoch(
        self,
        state: BusyDepths,
        depths: Mapping[str, int],
        slots: int,
        recent: RecentLoad,
        calibration: Calibration | None,
        features: RequestFeatures,
        *,
        calm: bool,
    ) -> None:
        settings = self.settings
        level = load_level(min(max(recent.load, 2.0), slots), settings)
        context, kinds = self._context(recent, features)
        role = calibration.cold_role(level, context, kinds) if calibration else None
        cold = settings.role_profile(role or settings.cold_busy_role)
        shallowest = min(depths, key=lambda p: (depths[p], p))
        deepest = max(depths, key=lambda p: (depths[p], p))
        first = cold if cold in depths else shallowest
        if state.cold in depths:
            first = held_cold(state, first)
        # The other depth measured: the deepest, or the shallowest when the cold pick is the
        # deepest (cold_busy_role = "max" still learns whether plain decoding is faster).
        other = deepest if first != deepest else shallowest
        epoch = next_busy_depth(
            state,
            first,
            other,
            settings.min_samples,
            settings.busy_epoch_admissions,
            calm=calm,
            priors=self._priors(calibration, other == deepest),
            confirm=role is not None and role != settings.cold_busy_role,
        )
        state.profile, state.exploring, state.cold = epoch.profile, epoch.exploring, first
        state.left = epoch.admissions or settings.busy_epoch_admissions

    def _context(
        self, recent: RecentLoad, features: RequestFeatures
    ) -> tuple[float, dict[str, float] | None]:
        """The context a busy process's requests decode at, and their content (kind -> share
        of their tokens), with the request being admitted counted."""
        decay = 0.5 ** (1.0 / self.settings.load_half_life_requests)
        context = recent.context.admit(features.est_prompt_tokens, decay, features.kind)
        return context.tokens(float(self.settings.long_context_tokens)), context.kinds()

    def _priors(self, calibration: Calibration | None, deeper: bool) -> Prior | None:
        """The calibrated log gap of the epochs' other depth against the cold one, per class
        and busy level, carried to the class's context: deepest vs depth 0 (``deeper``), or its
        opposite."""
        if calibration is None:
            return None
        contexts = bucket_contexts(self.settings.context_buckets)

        def prior(label: str, level: int) -> float | None:
            bucket, _, kind = label.partition("/")
            context = contexts.get(bucket, 0.0)
            gap = calibration.log_gap(level, context, kind or None) if level > 1 else None
            return None if gap is None else (gap if deeper else -gap)

        return prior

    @contextmanager
    def admission(self, backend: str, profile: str) -> Iterator[None]:
        """A request admitted into ``backend``'s busy epoch at ``profile``, for as long as it
        runs: counted once when it starts (the epoch has one admission less), and as finished
        when it ends, however it ends."""
        state = self.states.get(backend)
        if state is None:
            yield
            return
        state.left -= 1
        state.sent[profile] += 1
        try:
            yield
        finally:
            state.finished[profile] += 1

    def sample(
        self,
        backend: str,
        cls: RequestClass,
        profile: str,
        run: DepthRecord,
        speed: float,
        output_tokens: int,
    ) -> Callable[[], None] | None:
        """What a finished request at ``profile`` teaches its process's epochs, to apply when
        it is learned from; None if nothing. Its time at one depth counts, no more than it
        spent decoding (not its prefill); streamed, its speed over that time alone."""
        state = self.states.get(backend)
        if state is None or not self.settings.learning or speed <= 0 or output_tokens <= 0:
            return None
        scale = self.settings.clock_scale
        seconds = min(run.seconds * scale, output_tokens / speed)
        if run.tokens > 0 and run.seconds > 0:
            seconds = run.seconds * scale
            speed = run.tokens / seconds
        level = load_level(run.load, self.settings)
        decay = decay_factor(self.settings.half_life_samples)

        def learn() -> None:
            state.observe(cls, level, profile, speed, seconds, decay)

        return learn

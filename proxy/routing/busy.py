"""The depth a busy process runs at, learned from what it achieved there at each depth.

On one process, requests that decode together should share a depth (on hybrid models a second
depth costs every step an extra pass), and a request keeps the depth it was admitted at. So while
the process is busy the choice that matters is the process's, not the request's: every request
admitted beside others gets the depth of the current *epoch* (``busy_epoch_admissions``
admissions), and each epoch's depth is chosen from what the process achieved at each depth:

1. cold: ``cold_busy_role`` (off: published runs lose with speculation at 2-4 parallel
   requests) until it has ``min_samples`` measured requests;
2. then one epoch at the deepest depth, since newer builds batch the drafts well (and setups
   differ: which one wins is what is measured here); not repeated while its requests are still
   out, since a decision made before they report would be a blind one;
3. then the deepest depth while it is likely faster: entered when the chance that it is faster
   is above ``ENTER``, left when it falls below ``STAY``. The gap between the two keeps the
   process from flip-flopping between two close depths: each switch makes both depths decode
   side by side until the old requests finish, which costs more than either depth does. While
   the comparison is still open (a chance between ``DROP`` and ``ENTER`` on few requests), the
   deepest depth gets another epoch now and then: otherwise one unlucky early epoch would rule
   it out for good, since a process that stays cold measures only the cold depth.

The epochs at the deepest depth before it is known to be faster (``Epoch.exploring``) are the
price of learning, and on a saturated process a slower epoch is paid again as queueing by every
request behind it. So one starts only on an idle process (``calm``: the first request of a
burst), whose requests soon decode at its depth alone; started beside long requests at the
other depth, an epoch ran mixed until they ended and measured nothing, and was repeated. And
none starts once the deepest depth is clearly slower (a chance below ``DROP``), however few
requests say so. On the routing benchmark this took the adaptive policy on setup-a's default
trace from 0.77 to 1.02x depth 0 (bench.routing, one run; README "Routing").

What a depth achieved is the decode speed of the requests that ran at it while the process was
busy at that depth only, as log speed, each weighted by how long it ran so (LiveBackend's
single-depth clock): the time-weighted mean speed of a slot, which is what the process's
throughput is made of. Weighting by time, rather than keeping only the runs that stayed at one
depth throughout, matters: of the requests of a short epoch, those that finish before the next
epoch's depth joins them are the fast ones, so that filter measured the deep depth on setup-b
10 % faster than the cold one when it was 20 % slower. How sure a comparison is counts
requests, not seconds (a long run is still one request's speed). Speeds are compared cell by
cell: the class (context size and content kind) and the load level of the run (how many
requests decoded together on average over its time at one depth: 2-3 or 4+). A slot's speed
falls with the requests beside it, and an exploring epoch that starts on an idle process runs
at a lower load than the cold depth's average: compared across loads, drafting looked faster
than it was. A cell measured at the cold depth only is not left out: it is taken to differ as
the measured cells do, shrunk toward the published loss (``PRIOR_GAP``, a prior worth
``PRIOR_REQUESTS`` requests), and counts by its time like the others. Otherwise an epoch of
short chats that drafted well would move the process to the deepest depth while its long agent
prompts, most of its time, had never run there (setup-a: drafting halves their speed at 4+).

Pure: the state is data, the choice is a function of it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from proxy.routing.classes import RequestClass

ENTER = 0.8
"""Probability that the deepest depth is faster, above which a cold process moves to it."""
STAY = 0.5
"""... below which a process at the deepest depth goes back."""
DROP = 0.2
"""... and below which a process at the cold depth stops measuring the deepest one; between
the two, it measures it again (one epoch at a time) until the comparison rests on ``DECIDED``
times ``min_samples`` requests: an early comparison rests on a few requests of a few classes."""
DECIDED = 2
MIN_SD = 0.15
"""Floor of a class's log-speed spread: a few similar requests must not look certain."""
PRIOR_GAP = math.log(0.75)
"""What a class not yet measured at the other depth is taken to lose there, in log speed: the
published llama.cpp runs with 2-4 parallel requests (-22 % at 2, -30 % at 4, -19 % at 4 on
another GPU). A prior, not evidence: it moves the mean, not the count of requests."""
PRIOR_SD = 0.3
PRIOR_REQUESTS = 3.0
"""How many requests' worth of evidence the prior is: a class not yet measured at the other
depth is taken to differ as the measured ones do, shrunk toward ``PRIOR_GAP`` by this."""


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
            if not (speed.weight > 0 and speed.weight2 > 0 and math.isfinite(speed.mean)):
                raise ValueError(f"not a measurement: {row!r}")
            state.speeds[(str(row["class"]), int(row["level"]), str(row["profile"]))] = speed
        return state, dropped

    def gap(self, profile: str, reference: str) -> Gap:
        """``profile`` against ``reference``, class by class. Each class's difference counts by
        its share of the time measured at the two depths: what the process's throughput is
        made of (a few long agent prompts can take more of it than many short chats), where
        counting requests would let the short chats decide. How sure the mean is counts
        requests: each class's spread over the fewer of its two samples. A cell measured at
        ``reference`` only counts by its time there, at the measured cells' gap shrunk toward
        ``PRIOR_GAP`` (``PRIOR_REQUESTS``), with ``PRIOR_SD`` and no weight as evidence."""
        measured, unmeasured = [], []
        for (label, level, p), own in self.speeds.items():
            if p != reference:
                continue
            other = self.speeds.get((label, level, profile))
            if other is None:
                unmeasured.append(own.weight)
                continue
            n = min(own.requests, other.requests)
            spread = max((s for s in (own.sd, other.sd) if math.isfinite(s)), default=MIN_SD)
            row = (own.weight + other.weight, other.mean - own.mean, max(spread, MIN_SD), n)
            measured.append(row)
        evidence = sum(r[3] for r in measured)
        if evidence <= 0:
            return Gap(0.0, math.inf, 0.0)
        observed = sum(t * diff for t, diff, _, _ in measured) / sum(r[0] for r in measured)
        guess = (evidence * observed + PRIOR_REQUESTS * PRIOR_GAP) / (evidence + PRIOR_REQUESTS)
        rows = measured + [(t, guess, PRIOR_SD, 0.0) for t in unmeasured]
        share = sum(r[0] for r in rows)
        mean = sum(t * diff for t, diff, _, _ in rows) / share
        variance = sum((t / share) ** 2 * sd**2 / max(n, 1.0) for t, _, sd, n in rows)
        return Gap(mean, math.sqrt(variance), evidence)


@dataclass(frozen=True, slots=True)
class Epoch:
    """The depth of a busy epoch, and whether it explores: the deepest depth before it is
    known to be faster (left at ``ENTER``'s threshold, not ``STAY``'s)."""

    profile: str
    exploring: bool = False


def next_busy_depth(
    state: BusyDepths, cold: str, deep: str, min_samples: int, epoch: int, *, calm: bool = True
) -> Epoch:
    """The next busy epoch: at ``cold`` or ``deep`` (see the module's docstring). ``calm``: the
    process is idle now, so an exploring epoch's requests soon have it to themselves."""
    if cold == deep or state.samples(cold) < min_samples:
        return Epoch(cold)
    gap = state.gap(deep, cold)
    chance = gap.chance_faster
    staying = state.profile == deep and not state.exploring
    if gap.weight >= min_samples / 2 and chance >= (STAY if staying else ENTER):
        return Epoch(deep)
    still_open = chance > DROP and gap.weight < DECIDED * min_samples
    if still_open and calm and state.outstanding(deep) <= epoch / 2:
        return Epoch(deep, exploring=True)
    return Epoch(cold)

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

What a depth achieved is the decode speed of the requests that ran at it while the process was
busy at that depth only, as log speed, each weighted by how long it ran so (the pool's
single-depth clock): the time-weighted mean speed of a slot, which is what the process's
throughput is made of. Weighting by time, rather than keeping only the runs that stayed at one
depth throughout, matters: of the requests of a short epoch, those that finish before the next
epoch's depth joins them are the fast ones, so that filter measured the deep depth on setup-b
10 % faster than the cold one when it was 20 % slower. How sure a comparison is counts
requests, not seconds (a long run is still one request's speed). Speeds are compared class by
class (context size and content kind): an epoch of long agent prompts and one of short chats
are not compared with each other, only requests of one class are. (Comparing load level by
level too, 2-3 apart from 4+ decoding, was tried: the cells filled slower, and on one seed of
the default trace setup-b went to depth 3 for 88-127 of 159 requests.)

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
    speeds: dict[tuple[str, str], LogSpeed] = field(default_factory=dict)
    """(class label, profile) -> log decode speed while busy at that profile only."""
    sent: Counter[str] = field(default_factory=Counter)
    """Busy admissions per profile."""
    finished: Counter[str] = field(default_factory=Counter)
    """... and how many of them have finished (learned from or not)."""

    def observe(
        self, cls: RequestClass, profile: str, decode_tok_s: float, seconds: float, decay: float
    ) -> None:
        """A request at ``profile`` that decoded at ``decode_tok_s`` on average, ``seconds`` of
        it while the process was busy at ``profile`` only."""
        if decode_tok_s > 0 and seconds > 0:
            cell = self.speeds.setdefault((cls.label, profile), LogSpeed())
            cell.add(math.log(decode_tok_s), seconds, decay)

    def samples(self, profile: str) -> float:
        """How many requests' worth of speeds the process has at ``profile``."""
        return sum(e.requests for (_, p), e in self.speeds.items() if p == profile)

    def outstanding(self, profile: str) -> int:
        return self.sent[profile] - self.finished[profile]

    def report(self) -> dict[str, object]:
        """For /admin/routing: the epoch, and per profile the samples and requests out."""
        return {
            "profile": self.profile,
            "left": self.left,
            "samples": {p: round(self.samples(p), 2) for p in sorted({p for _, p in self.speeds})},
            "outstanding": {p: self.outstanding(p) for p in sorted(self.sent)},
        }

    def to_json(self) -> list[dict[str, object]]:
        """What it measured (the epoch and its counts are the running process's, not saved)."""
        return [
            {"class": label, "profile": profile, **asdict(speed)}
            for (label, profile), speed in sorted(self.speeds.items())
        ]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]], labels: set[str]) -> tuple[BusyDepths, int]:
        """A saved state's measurements, and how many were dropped: a class label no longer
        in ``labels`` (the context buckets changed since the file was written)."""
        state, dropped = cls(), 0
        for row in rows:
            if str(row["class"]) not in labels:
                dropped += 1
                continue
            speed = LogSpeed(**{f.name: float(row[f.name]) for f in fields(LogSpeed)})
            if not (speed.weight > 0 and speed.weight2 > 0 and math.isfinite(speed.mean)):
                raise ValueError(f"not a measurement: {row!r}")
            state.speeds[(str(row["class"]), str(row["profile"]))] = speed
        return state, dropped

    def gap(self, profile: str, reference: str) -> Gap:
        """``profile`` against ``reference``, class by class. Each class's difference counts by
        its share of the time measured at the two depths: what the process's throughput is
        made of (a few long agent prompts can take more of it than many short chats), where
        counting requests would let the short chats decide. How sure the mean is counts
        requests: each class's spread over the fewer of its two samples."""
        rows = []
        for (label, p), own in self.speeds.items():
            other = self.speeds.get((label, reference))
            if p != profile or other is None:
                continue
            n = min(own.requests, other.requests)
            spread = max((s for s in (own.sd, other.sd) if math.isfinite(s)), default=MIN_SD)
            rows.append((own.weight + other.weight, own.mean - other.mean, max(spread, MIN_SD), n))
        share = sum(r[0] for r in rows)
        if not rows or share <= 0:
            return Gap(0.0, math.inf, 0.0)
        mean = sum(t * diff for t, diff, _, _ in rows) / share
        variance = sum((t / share) ** 2 * sd**2 / max(n, 1.0) for t, _, sd, n in rows)
        return Gap(mean, math.sqrt(variance), sum(r[3] for r in rows))


def next_busy_depth(state: BusyDepths, cold: str, deep: str, min_samples: int, epoch: int) -> str:
    """The depth of the next busy epoch: ``cold`` or ``deep`` (see the module's docstring)."""
    if cold == deep or state.samples(cold) < min_samples:
        return cold
    gap = state.gap(deep, cold)
    if gap.weight < min_samples / 2:  # the deepest depth is unknown yet: one epoch there
        return cold if state.outstanding(deep) > epoch / 2 else deep
    chance = gap.chance_faster
    if state.profile == deep:
        return deep if chance >= STAY else cold
    if chance >= ENTER:
        return deep
    undecided = chance > DROP and gap.weight < DECIDED * min_samples
    return deep if undecided and state.outstanding(deep) <= epoch / 2 else cold

"""A process's recent admissions: how many decoded beside each, and the context they brought,
decayed per admission (half-life ``load_half_life_requests``).

The recent load places a request's load level when it is the first of a burst (``depth``); the
recent context is what a busy process's calibrated gap is carried to (``busy``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BUSY_CONTEXT_PRIOR = 2.0
"""Admissions' worth of ``long_context_tokens`` in a process's busy context before it has any."""


@dataclass(frozen=True, slots=True)
class RecentContext:
    """The admissions' prompt tokens, blended with ``BUSY_CONTEXT_PRIOR`` admissions of
    ``long_context_tokens``, which decay with the admissions too (docs/routing.md, "Busy
    epochs": why the prior, and why it decays)."""

    count: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    prior: float = BUSY_CONTEXT_PRIOR
    code: float = 0.0
    """The part of ``total`` that was code."""

    def admit(self, tokens: float, decay: float, kind: str) -> RecentContext:
        return RecentContext(
            self.count * decay + 1.0,
            self.total * decay + tokens,
            self.squares * decay + tokens**2,
            self.prior * decay,
            self.code * decay + (tokens if kind == "code" else 0.0),
        )

    def kinds(self) -> dict[str, float] | None:
        """The admissions' content, kind -> share of their tokens (None before any)."""
        if self.total <= 0:
            return None
        return {"code": self.code / self.total, "prose": 1.0 - self.code / self.total}

    def tokens(self, prior_tokens: float) -> float:
        """Weighted by tokens: a long agent prompt holds the process, and every step beside
        it, far longer than a chat."""
        mean = self.squares / self.total if self.total > 0 else 0.0
        return (self.count * mean + self.prior * prior_tokens) / (self.count + self.prior)


@dataclass(frozen=True, slots=True)
class RecentLoad:
    """One process's recent admissions."""

    load: float = 1.0
    """Decayed mean of the requests in flight at each admission, the new one included."""
    context: RecentContext = field(default_factory=RecentContext)

    def admit(self, in_flight: int, tokens: float, kind: str, decay: float) -> RecentLoad:
        """With one more admission, beside ``in_flight`` others, of ``tokens`` of ``kind``."""
        load = self.load * decay + (in_flight + 1) * (1 - decay)
        return RecentLoad(load, self.context.admit(tokens, decay, kind))

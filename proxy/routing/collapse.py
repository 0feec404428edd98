"""The acceptance-collapse guard of one backend: drafting whose acceptance fell to about nothing.

Known bugs drive MTP acceptance to about 0 (llama.cpp #27151, #27572, #23636), and in SGLang it
decays over a day of uptime (docs/published-figures.md#acceptance-collapse). Without a guard the
learned statistics would slowly "learn" that drafting loses in every class and keep that table
after the bug is fixed. So each backend keeps a window of its recent drafted requests and
compares what they accepted with what their classes had learned to expect:

- **collapsed** once the window holds at least ``WINDOW_TOKENS`` drafted tokens, accepted fewer
  than ``COLLAPSE_RATIO`` of the expected accepted tokens, and fewer than ``COLLAPSE_CEILING``
  of the drafted ones. Both thresholds, since a class may legitimately accept little (SGLang
  #30763: 0.19 past 32K context): a collapse is far below the class's own value *and* near 0.
  The published collapses are ~0 (a random MTP block accepts 1 in 751 on the project's tiny
  model); a healthy drafter at 30 % acceptance accepts ~77 of 256 drafted tokens, and 38 (15 %)
  is over five standard deviations below that even counting steps (~100), not tokens, as the
  independent draws;
- while collapsed the backend serves depth 0 (the router's reason ``collapsed``), and the
  requests that drafted during the collapse teach the statistics nothing: what was learned
  before stays. A request that drafted far below its expectation before the verdict is held
  back (``hold``) until ``WINDOW_TOKENS`` drafted from it on say whether it was a collapse
  (dropped) or not (learned): judged by the rolling window, older healthy requests would vouch
  for it;
- a **trial** drafts again after ``retry_s``, doubling up to ``retry_max_s`` after each failed
  one: the next request(s) run at the deepest depth until ``TRIAL_TOKENS`` are drafted (or
  ``TRIAL_REQUESTS`` requests ran), and the guard lifts once they accepted at least
  ``RECOVERY_RATIO`` of what was expected.

Pure: times come in as numbers, the router owns the clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

WINDOW_TOKENS = 256
"""Drafted tokens a verdict rests on ("hundreds of tokens": the published bugs' scale)."""
COLLAPSE_RATIO = 0.25
"""Accepted / expected accepted below which the window has collapsed ..."""
COLLAPSE_CEILING = 0.15
"""... and accepted / drafted below which (both must hold)."""
RECOVERY_RATIO = 0.5
"""A trial that accepted at least this share of what was expected lifts the guard."""
TRIAL_TOKENS = 64
"""Drafted tokens a trial's verdict rests on: a healthy drafter at 50 % accepts ~32 of them,
a collapsed one ~0, so a few dozen tell the two apart."""
TRIAL_REQUESTS = 4
"""... or at most this many requests (a collapsed drafter may hardly draft at all)."""
MAX_HELD = 64
"""Observations held back at most while a window decides (bounded memory)."""

Verdict = Literal["none", "healthy", "collapsed", "still", "recovered"]


@dataclass(slots=True)
class _Tally:
    drafted: float = 0.0
    accepted: float = 0.0
    expected: float = 0.0  # expected accepted tokens: drafted x the class's learned acceptance
    requests: int = 0

    def add(self, drafted: float, accepted: float, expected: float) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.expected += expected
        self.requests += 1

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted > 0 else 0.0

    @property
    def ratio(self) -> float:
        return self.accepted / self.expected if self.expected > 0 else 1.0


def _collapsed(tally: _Tally) -> bool:
    return tally.acceptance < COLLAPSE_CEILING and tally.ratio < COLLAPSE_RATIO


def suspect(drafted: int, accepted: int, expected_acceptance: float) -> bool:
    """Whether one request alone looks collapsed (its learning waits for the window)."""
    if drafted <= 0:
        return False
    acceptance = accepted / drafted
    return acceptance < COLLAPSE_CEILING and acceptance < COLLAPSE_RATIO * expected_acceptance


@dataclass
class CollapseGuard:
    """One backend's window, verdict, back-off and held-back learning."""

    retry_s: float = 30.0
    retry_max_s: float = 3600.0
    window: deque[tuple[int, int, float]] = field(default_factory=deque)
    collapsed_at: float | None = None
    cause: str = ""
    backoff_s: float = 0.0
    next_trial_at: float = 0.0
    trial: _Tally | None = None
    trials: int = 0
    collapses: int = 0
    held: list[Callable[[], None]] = field(default_factory=list)
    since_held: _Tally = field(default_factory=_Tally)
    """What was drafted from the oldest held observation on (itself included)."""
    dropped: int = 0
    """Observations dropped as the collapse's (not learned), over the guard's life."""
    last: _Tally = field(default_factory=_Tally)
    """The window's tally at the last verdict (for the admin view)."""

    @property
    def collapsed(self) -> bool:
        return self.collapsed_at is not None

    def trial_due(self, now: float) -> bool:
        """Collapsed, and a trial is under way or its back-off is over."""
        return self.collapsed and (self.trial is not None or now >= self.next_trial_at)

    def begin_trial(self) -> None:
        if self.trial is None:
            self.trial = _Tally()

    def hold(
        self, learn: Callable[[], None], drafted: int, accepted: int, expected_acceptance: float
    ) -> None:
        """Keep the learning of the request just observed until ``WINDOW_TOKENS`` drafted from
        it on give a verdict (``observe``)."""
        if not self.held:
            self.since_held = _Tally()
            self.since_held.add(drafted, accepted, drafted * max(expected_acceptance, 0.0))
        if len(self.held) < MAX_HELD:
            self.held.append(learn)
        else:
            self.dropped += 1

    def observe(
        self, drafted: int, accepted: int, expected_acceptance: float, now: float, *, trial: bool
    ) -> Verdict:
        """One drafted request (``trial``: sent as the collapse's trial). The verdict: "none"
        (not enough tokens yet), "healthy", "collapsed" (just now), "still" (a trial failed),
        "recovered" (a trial passed)."""
        expected = drafted * max(expected_acceptance, 0.0)
        if self.collapsed:
            if not trial or self.trial is None:
                return "none"  # a pinned or late request: the trial decides, not it
            self.trial.add(drafted, accepted, expected)
            return self._judge_trial(now)
        if self.held:
            self.since_held.add(drafted, accepted, expected)
            if self.since_held.drafted >= WINDOW_TOKENS:
                if _collapsed(self.since_held):
                    self._collapse(self.since_held, now)
                    return "collapsed"
                self._release()
        self.window.append((drafted, accepted, expected))
        while len(self.window) > 1 and sum(d for d, _, _ in self.window) - self.window[0][0] >= (
            WINDOW_TOKENS
        ):
            self.window.popleft()
        tally = _Tally()
        for d, a, e in self.window:
            tally.add(d, a, e)
        if tally.drafted < WINDOW_TOKENS:
            return "none"
        self.last = tally
        if _collapsed(tally):
            self._collapse(tally, now)
            return "collapsed"
        return "healthy"

    def _collapse(self, tally: _Tally, now: float) -> None:
        self.collapsed_at = now
        self.collapses += 1
        self.cause = (
            f"acceptance {tally.acceptance:.1%} over the last {tally.drafted:.0f} drafted tokens "
            f"({tally.requests} requests), {tally.ratio:.0%} of what their classes had learned "
            f"({tally.expected / tally.drafted:.0%})"
        )
        self.backoff_s = self.retry_s
        self.next_trial_at = now + self.backoff_s
        self.dropped += len(self.held)
        self.held.clear()
        self.window.clear()

    def _judge_trial(self, now: float) -> Verdict:
        trial = self.trial
        assert trial is not None
        if trial.drafted < TRIAL_TOKENS and trial.requests < TRIAL_REQUESTS:
            return "none"
        self.trial, self.trials = None, self.trials + 1
        self.last = trial
        if trial.drafted > 0 and trial.ratio >= RECOVERY_RATIO:
            self.collapsed_at, self.cause = None, ""
            self.window.clear()
            return "recovered"
        self.backoff_s = min(self.backoff_s * 2, self.retry_max_s)
        self.next_trial_at = now + self.backoff_s
        return "still"

    def _release(self) -> None:
        held, self.held = self.held, []
        for learn in held:
            learn()

    def report(self, now: float) -> dict[str, object]:
        """For /admin/routing: the state, what the last verdict rested on, the back-off."""
        last = self.last
        return {
            "collapsed": self.collapsed,
            "cause": self.cause or None,
            "acceptance": round(last.acceptance, 4) if last.drafted else None,
            "expected": round(last.expected / last.drafted, 4) if last.drafted else None,
            "drafted": round(last.drafted),
            "collapses": self.collapses,
            "trials": self.trials,
            "next_trial_in_s": (
                round(max(self.next_trial_at - now, 0.0), 1) if self.collapsed else None
            ),
            "held": len(self.held),
            "dropped": self.dropped,
        }

"""Each backend's acceptance-collapse guard (``collapse``), and the fate of a finished request:
learned now, held until the guard's window says whether it was a collapse, or skipped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum

import structlog

from proxy.routing.collapse import CollapseGuard, suspect

log = structlog.get_logger("proxy.routing")
KNOWN_CAUSES = (
    "MTP bugs that drive acceptance to ~0 (llama.cpp #27151, #27572, #23636) or a drafter "
    "decaying over uptime"
)


class Fate(Enum):
    """What a finished request teaches the statistics."""

    LEARN = "learn"
    HOLD = "hold"
    """Held until the drafts after it say whether it was a collapse (``CollapseGuard.hold``)."""
    SKIP = "skip"
    """Nothing: it drafted during a collapse, or as its trial; what was learned before stays."""


class CollapseGuards:
    """Backend name -> its guard, made at its first drafted request."""

    def __init__(self, retry_s: float, retry_max_s: float) -> None:
        self._retry = (retry_s, retry_max_s)
        self._guards: dict[str, CollapseGuard] = {}

    def __getitem__(self, backend: str) -> CollapseGuard:
        return self._guards[backend]

    def __len__(self) -> int:
        return len(self._guards)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._guards))

    def get(self, backend: str) -> CollapseGuard | None:
        return self._guards.get(backend)

    def of(self, backend: str) -> CollapseGuard:
        guard = self._guards.get(backend)
        if guard is None:
            guard = self._guards[backend] = CollapseGuard(*self._retry)
        return guard

    def fate(
        self,
        backend: str,
        model: str,
        drafts: tuple[int, int],
        expected: float,
        now: float,
        *,
        trial: bool,
    ) -> Fate:
        """The fate of a request that drafted ``drafts`` (drafted, accepted) where its class
        expected ``expected`` acceptance; ``trial``: it ran as the collapse's trial."""
        drafted, accepted = drafts
        guard = self.of(backend)
        verdict = guard.observe(drafted, accepted, expected, now, trial=trial)
        where = {"backend": backend, "model": model}
        if verdict == "collapsed":
            log.warning(
                "acceptance_collapsed",
                **where,
                cause=guard.cause,
                serving="depth 0",
                next_trial_in_s=round(guard.backoff_s, 1),
                dropped=guard.dropped,
                known_causes=KNOWN_CAUSES,
            )
        elif verdict == "still":
            log.warning(
                "acceptance_still_collapsed",
                **where,
                trial_acceptance=round(guard.last.acceptance, 4),
                trial_drafted=round(guard.last.drafted),
                next_trial_in_s=round(guard.backoff_s, 1),
            )
        elif verdict == "recovered":
            expected_now = guard.last.expected / max(guard.last.drafted, 1.0)
            log.info(
                "acceptance_recovered",
                **where,
                trial_acceptance=round(guard.last.acceptance, 4),
                expected=round(expected_now, 4),
                trials=guard.trials,
            )
        if trial or guard.collapsed or verdict in ("collapsed", "still"):
            return Fate.SKIP
        return Fate.HOLD if suspect(drafted, accepted, expected) else Fate.LEARN

    def settle(
        self,
        backend: str,
        fate: Fate,
        learn: Callable[[], None],
        drafts: tuple[int, int],
        expected: float,
    ) -> None:
        """Act on a request's fate: ``learn`` it now, hold it, or drop it."""
        if fate is Fate.LEARN:
            learn()
        elif fate is Fate.HOLD:
            self.of(backend).hold(learn, *drafts, expected)

    def report(self, now: float) -> dict[str, dict[str, object]]:
        return {name: self._guards[name].report(now) for name in self}

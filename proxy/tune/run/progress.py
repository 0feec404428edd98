"""Progress of a tune run: a bar on a terminal, lines otherwise, and an estimate that learns.

Each request comes with its planned seconds (``proxy.tune.plan.estimate``, on the wall clock). The
time left is the planned seconds still to go, scaled by how the run's measured time compares
with the planned seconds of what it has done so far, plus the backend starts still to come at
what a start took: a run whose long prompts prefill slower than the warm-up's corrects itself
from its first long prompt on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

_BAR = 28
CALIBRATED_AFTER = 3
"""Requests measured before the estimate is said again, from their measured pace: the plan's
comes from a warm-up (or priors) and may be far off (a small model that stops early)."""


def _now() -> float:
    return time.monotonic()  # looked up at each call: a test may move the clock


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Counts measured requests; the time left follows the measured pace."""

    def __init__(
        self,
        total: int,
        planned_s: float,
        stream: TextIO | None = None,
        *,
        starts: int = 0,
        start_s: float = 0.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.total = max(total, 1)
        self.done = 0
        self.planned_s = planned_s  # wall seconds of the requests still to measure, at the start
        self.planned_done = 0.0
        self.starts_left = starts
        self.start_s = start_s
        self.starting_s = 0.0  # wall seconds spent starting backends, not measuring
        self.phase = ""
        self._clock = clock or _now
        self._started = self._clock()
        self._planned_wall = planned_s + starts * start_s
        self._line_open = False

    def eta_s(self) -> float:
        left = max(self.planned_s - self.planned_done, 0.0)
        measuring = self._clock() - self._started - self.starting_s
        if self.planned_done > 0 and measuring > 0:
            left *= measuring / self.planned_done
        return left + self.starts_left * self.start_s

    def started(self, seconds: float) -> None:
        """A backend start is over; it took ``seconds``."""
        self.starts_left = max(self.starts_left - 1, 0)
        self.starting_s += seconds
        self.start_s = seconds if self.start_s == 0 else (self.start_s + seconds) / 2

    def begin(self, phase: str) -> None:
        self.phase = phase
        if self.tty:
            self._draw()
        else:
            self._line(f"tune: {phase}")

    def tick(self, what: str, planned_s: float = 0.0) -> None:
        self.done += 1
        self.planned_done += planned_s
        if self.done == CALIBRATED_AFTER and self.planned_done > 0:
            self._say_calibrated()
        if self.tty:
            self._draw()
        else:
            eta = format_duration(self.eta_s())
            self._line(f"tune: [{self.done}/{self.total}] {self.phase} {what} (left ~{eta})")

    def _say_calibrated(self) -> None:
        """The estimate again, from the first requests' measured pace (once)."""
        elapsed = self._clock() - self._started
        measuring = elapsed - self.starting_s
        total = format_duration(elapsed + self.eta_s())
        planned = format_duration(self._planned_wall)
        self.note(
            f"tune: the first {self.done} requests took {format_duration(measuring)} where the "
            f"plan said {format_duration(self.planned_done)}: ~{total} in all now (the plan "
            f"said ~{planned}); the time left follows the pace as it goes"
        )

    def skip(self, planned_s: float = 0.0) -> None:
        """A request that will not be sent (its class is given up): the plan shrinks."""
        self.total = max(self.total - 1, self.done, 1)
        self.planned_s = max(self.planned_s - planned_s, 0.0)

    def note(self, text: str) -> None:
        """A message that must not be overwritten by the bar."""
        self._line(text)

    def close(self) -> None:
        if self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False

    def _draw(self) -> None:
        filled = int(_BAR * min(self.done, self.total) / self.total)
        bar = "#" * filled + "." * (_BAR - filled)
        eta = format_duration(self.eta_s())
        text = f"\r[{bar}] {self.done}/{self.total} {self.phase[:40]:<40} ~{eta} left "
        self.stream.write(text)
        self.stream.flush()
        self._line_open = True

    def _line(self, text: str) -> None:
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.tty and self.phase:
            self._draw()

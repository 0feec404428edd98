"""Progress of a tune run: the estimate before it starts, a bar on a terminal, lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_BAR = 28


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
    """Counts measured requests; the ETA follows the measured pace once there is one."""

    def __init__(self, total: int, estimate_s: float, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.total = max(total, 1)
        self.done = 0
        self.estimate_s = estimate_s
        self.phase = ""
        self._started = time.monotonic()
        self._line_open = False

    def eta_s(self) -> float:
        if self.done == 0:
            return self.estimate_s
        elapsed = time.monotonic() - self._started
        return elapsed / self.done * (self.total - self.done)

    def begin(self, phase: str) -> None:
        self.phase = phase
        if self.tty:
            self._draw()
        else:
            self._line(f"tune: {phase}")

    def tick(self, what: str) -> None:
        self.done += 1
        if self.tty:
            self._draw()
        else:
            eta = format_duration(self.eta_s())
            self._line(f"tune: [{self.done}/{self.total}] {self.phase} {what} (left ~{eta})")

    def note(self, text: str) -> None:
        """A message that must not be overwritten by the bar."""
        self._line(text)

    def close(self) -> None:
        if self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False

    def _draw(self) -> None:
        filled = int(_BAR * self.done / self.total)
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

"""The single-depth clock of one process: how long it ran busy at one depth only.

A process serving per-request depths decodes every request beside the others in one step. What a
depth achieves under load shows only while every request decoding there runs at that depth: a
request beside another depth pays the step's extra pass, or rides on the other's drafting. The
clock of a depth runs while two or more requests decode and every one is at that depth; each
request reads it when it starts and ends decoding, and the difference is how long its run showed
what its depth achieves under load, whether the request itself was fast or slow (routing.busy).

A request decodes from its first token when it streams (its prompt decodes at no depth), else from
its start. The clock is the routing brain's: the serving layer only reports those two moments and
the chunks of a stream (``DecodeRun``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class DepthRecord:
    """What one request's run says about its depth: the value the router learns it from."""

    mixed: bool = False
    """It decoded beside another depth at some time (or never decoded): its speed is the mix's."""
    seconds: float = 0.0
    """How long it decoded while the process was busy at its depth only."""
    load: float = 0.0
    """How many requests decoded together then, on average, itself included (0: no such time)."""
    tokens: int = 0
    """The tokens it streamed then (0: not streamed, or none then)."""


@dataclass
class DepthClock:
    """One process: the requests decoding by depth (a profile) and each depth's clock."""

    clock: Callable[[], float] = time.perf_counter
    decoding: Counter[str] = field(default_factory=Counter)
    """Requests decoding by the profile they run at."""
    depth_mixes: int = 0
    """Starts of a request while another profile decoded: a request that sees this change, or
    that starts beside another profile, ran at mixed depths (``ran_mixed``)."""
    busy_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds busy at one profile only, up to ``_since``."""
    slot_seconds: dict[str, float] = field(default_factory=dict)
    """... and those seconds times the requests decoding then."""
    _since: float = 0.0

    @contextmanager
    def run(self, profile: str, *, prefill: bool) -> Iterator[DecodeRun]:
        """One request at ``profile`` for as long as it is served. ``prefill``: it streams, and
        decodes only from its first token on (``DecodeRun.decoding``)."""
        run = DecodeRun(self, profile)
        if not prefill:
            run.decoding()
        try:
            yield run
        finally:
            if run.decoding_from is not None:
                self.end(profile)

    def beside_other(self, profile: str) -> bool:
        """Whether a request at another profile decodes here now."""
        return any(p != profile for p in self.decoding)

    def busy_at(self, profile: str) -> bool:
        """Whether the clock of ``profile`` runs now: two or more requests decoding, every one
        at ``profile``."""
        return len(self.decoding) == 1 and self.decoding.get(profile, 0) >= 2

    def seconds(self, profile: str) -> float:
        """The clock of ``profile``: seconds this process was busy at it only."""
        return self.busy_seconds.get(profile, 0.0) + self._open_span(profile, self.clock())

    def slot_seconds_at(self, profile: str) -> float:
        """The same clock, each second counted once per request decoding then."""
        spent = self.slot_seconds.get(profile, 0.0)
        return spent + self._open_span(profile, self.clock()) * self.decoding[profile]

    def begin(self, profile: str) -> None:
        """A request at ``profile`` starts decoding here."""
        if self.beside_other(profile):
            self.depth_mixes += 1
        self._settle()
        self.decoding[profile] += 1

    def end(self, profile: str) -> None:
        """... and ends."""
        self._settle()
        self.decoding[profile] -= 1
        if self.decoding[profile] <= 0:
            del self.decoding[profile]

    def _open_span(self, profile: str, now: float) -> float:
        return now - self._since if self.busy_at(profile) else 0.0

    def _settle(self) -> None:
        """Close the span so far: the set of decoding requests is about to change."""
        now = self.clock()
        for profile, count in self.decoding.items():
            span = self._open_span(profile, now)
            self.busy_seconds[profile] = self.busy_seconds.get(profile, 0.0) + span
            self.slot_seconds[profile] = self.slot_seconds.get(profile, 0.0) + span * count
        self._since = now


@dataclass
class DecodeRun:
    """One request on a process: whether it decodes yet, and its depth's clock when it began."""

    clock: DepthClock
    profile: str
    decoding_from: float | None = None
    slots_from: float = 0.0
    mix_mark: int | None = None
    """None if another profile decoded when it began, else the clock's ``depth_mixes`` then."""
    tokens: int = 0
    """Tokens streamed while its depth's clock ran (``streamed``)."""

    def decoding(self) -> None:
        """Its first token: from now on it decodes beside the others (once; later calls do
        nothing)."""
        if self.decoding_from is None:
            clock = self.clock
            self.mix_mark = None if clock.beside_other(self.profile) else clock.depth_mixes
            clock.begin(self.profile)
            self.decoding_from = clock.seconds(self.profile)
            self.slots_from = clock.slot_seconds_at(self.profile)

    def streamed(self, chunk: bytes) -> None:
        """A chunk of its stream arrived: its first marks ``decoding``; its tokens count while
        the process is busy at its profile only. Counted as stream events, one per token in
        llama-server's streams (an event ends with a blank line, which JSON text cannot hold),
        not as the final timings' total: a request that also ran alone or beside another depth
        decodes faster or slower there, and its whole-run speed would carry that into the busy
        comparison (docs/routing.md, "Busy epochs")."""
        self.decoding()
        if self.clock.busy_at(self.profile):
            self.tokens += chunk.count(b"\n\n") + chunk.count(b"\r\n\r\n")

    @property
    def ran_mixed(self) -> bool:
        """Whether it decoded beside another profile at any time (or never decoded)."""
        return self.mix_mark is None or self.mix_mark != self.clock.depth_mixes

    def record(self) -> DepthRecord:
        """What its run says about its depth, so far."""
        if self.decoding_from is None:
            return DepthRecord(mixed=True)
        seconds = self.clock.seconds(self.profile) - self.decoding_from
        slot_seconds = self.clock.slot_seconds_at(self.profile) - self.slots_from
        load = slot_seconds / seconds if seconds > 0 else 0.0
        return DepthRecord(self.ran_mixed, seconds, load, self.tokens)

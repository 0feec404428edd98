"""The proxy's live view of its backends: readiness pushed by the supervisor, load counted here.

The supervisor reports every state change through `LiveBackends.on_change` at once, so a request
is never sent to a backend that is not ready. In-flight counts are the proxy's own: the policy
uses them to spill load, and the supervisor reads them to drain a backend before stopping it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from supervisor.spec import BackendSpec
from supervisor.states import BackendState

# STOPPING too: a restart (admin, or a hung process replaced) goes through it, and requests of
# a one-process model wait through a restart rather than get 503 (a backend stopped for good is
# removed from the live backends once stopped, and its waiters time out with 429 at worst).
_COMING_BACK = frozenset(
    {BackendState.STARTING, BackendState.STOPPING, BackendState.STOPPED, BackendState.UNHEALTHY}
)


@dataclass
class LiveBackend:
    """What the proxy tracks about one backend."""

    name: str
    model: str
    profile: str
    base_url: str | None
    state: BackendState = BackendState.STARTING
    in_flight: int = 0
    slots: int = 1
    started_total: int = 0  # requests ever sent; tells whether a request ran alone
    decoding: Counter[str] = field(default_factory=Counter)
    """Requests in flight by the profile they run at (a per-request process serves several),
    from their first token on when they stream (``Lease.decoding``), else from their start."""
    recent_load: float = 1.0
    """Decayed mean of the requests in flight at each admission, the new one included."""
    depth_mixes: int = 0
    """Admissions at a profile while another decoded: a request that sees this change, or that
    starts beside another profile, ran at mixed depths (see ``ran_mixed``)."""
    generation: int = 0
    """Times it became ready: a request that failed on one process may try its successor."""
    clock: Callable[[], float] = time.perf_counter
    busy_at_one_depth: dict[str, float] = field(default_factory=dict)
    """Seconds it spent busy at one profile only (two or more requests decoding, every one at
    that profile), up to ``_since``: see ``single_depth_seconds``."""
    slots_at_one_depth: dict[str, float] = field(default_factory=dict)
    """... and those seconds times the requests decoding then: see ``single_depth_load``."""
    _since: float = 0.0

    @property
    def ready(self) -> bool:
        return self.state == BackendState.READY and self.base_url is not None

    @property
    def has_room(self) -> bool:
        return self.ready and self.in_flight < self.slots

    def mix_mark(self, profile: str) -> int | None:
        """Taken before a request's lease: None if another profile decodes already, else the
        admissions-at-mixed-depths count that ``ran_mixed`` compares with at its end."""
        return None if self.beside_other(profile) else self.depth_mixes

    def beside_other(self, profile: str) -> bool:
        """Whether a request at another profile decodes here now."""
        return any(p != profile for p in self.decoding)

    def ran_mixed(self, mark: int | None) -> bool:
        """Whether the request whose mark this is decoded beside another profile at any time:
        its speed then says little about its own depth (the step ran an extra pass for the
        other depth, or the other's drafting rode on it)."""
        return mark is None or mark != self.depth_mixes

    def single_depth_seconds(self, profile: str) -> float:
        """A clock that runs while this process is busy at ``profile`` only. A request reads it
        at its start and end: the difference is how long its run showed what ``profile``
        achieves under load, whether the request itself was fast or slow (routing.busy)."""
        return self.busy_at_one_depth.get(profile, 0.0) + self._open_span(profile, self.clock())

    def single_depth_slot_seconds(self, profile: str) -> float:
        """The same clock, each second counted once per request decoding then: the difference
        of the two over that of ``single_depth_seconds`` is how many requests decoded together,
        on average, while a request's run showed what ``profile`` achieves."""
        spent = self.slots_at_one_depth.get(profile, 0.0)
        return spent + self._open_span(profile, self.clock()) * self.decoding[profile]

    def begin(self, profile: str) -> None:
        """A request at ``profile`` starts decoding here."""
        if self.beside_other(profile):
            self.depth_mixes += 1
        self._settle()
        self.decoding[profile] += 1

    def end(self, profile: str) -> None:
        self._settle()
        self.decoding[profile] -= 1
        if self.decoding[profile] <= 0:
            del self.decoding[profile]

    def busy_at(self, profile: str) -> bool:
        """Whether the single-depth clock of ``profile`` runs now: two or more requests
        decoding, every one at ``profile``."""
        return len(self.decoding) == 1 and self.decoding.get(profile, 0) >= 2

    def _open_span(self, profile: str, now: float) -> float:
        return now - self._since if self.busy_at(profile) else 0.0

    def _settle(self) -> None:
        """Close the span so far: the set of decoding requests is about to change."""
        now = self.clock()
        for profile, count in self.decoding.items():
            span = self._open_span(profile, now)
            self.busy_at_one_depth[profile] = self.busy_at_one_depth.get(profile, 0.0) + span
            slots = self.slots_at_one_depth.get(profile, 0.0)
            self.slots_at_one_depth[profile] = slots + span * count
        self._since = now

    @property
    def coming_back(self) -> bool:
        """Not ready now, but the supervisor is bringing it (back) up: worth waiting for."""
        return not self.ready and self.state in _COMING_BACK


class LiveBackends:
    def __init__(self) -> None:
        self._backends: dict[str, LiveBackend] = {}

    def update(
        self, spec: BackendSpec, state: BackendState, base_url: str | None, slots: int = 1
    ) -> LiveBackend:
        backend = self._backends.get(spec.name)
        if backend is None:
            backend = LiveBackend(spec.name, spec.model, spec.profile, base_url, state, slots=slots)
            self._backends[spec.name] = backend
        was_ready = backend.ready
        backend.state, backend.base_url = state, base_url
        if backend.ready and not was_ready:
            backend.generation += 1
        return backend

    def remove(self, name: str) -> None:
        self._backends.pop(name, None)

    def get(self, name: str) -> LiveBackend | None:
        return self._backends.get(name)

    def of_model(self, model: str) -> list[LiveBackend]:
        return [b for b in self._backends.values() if b.model == model]

    def ready_of_model(self, model: str) -> list[LiveBackend]:
        return [b for b in self._backends.values() if b.model == model and b.ready]

    def free_slots(self, model: str) -> int:
        """Requests the ready backends of `model` could start right now."""
        return sum(max(0, b.slots - b.in_flight) for b in self.ready_of_model(model))

    def all(self) -> list[LiveBackend]:
        return list(self._backends.values())

    def in_flight(self, name: str) -> int:
        backend = self._backends.get(name)
        return backend.in_flight if backend else 0

    @contextmanager
    def lease(
        self, backend: LiveBackend, profile: str | None = None, *, prefill: bool = False
    ) -> Iterator[Lease]:
        """Count a request (at `profile`) against `backend` for as long as it is being served.
        ``prefill``: it streams, and counts as decoding only from its first token on
        (``Lease.decoding``), since a prompt being processed decodes at no depth."""
        backend.in_flight += 1
        backend.started_total += 1
        lease = Lease(backend, profile or backend.profile)
        if not prefill:
            lease.decoding()
        try:
            yield lease
        finally:
            backend.in_flight -= 1
            if lease.decoding_from is not None:
                backend.end(lease.profile)


@dataclass
class Lease:
    """One request on a backend: whether it decodes yet, and the single-depth clock of its
    profile when it began to (``LiveBackend.single_depth_seconds``)."""

    backend: LiveBackend
    profile: str
    decoding_from: float | None = None
    slots_from: float = 0.0
    mix_mark: int | None = None
    single_depth_events: int = 0
    """Stream events (one per token) that arrived while the single-depth clock ran: over
    ``single_depth_s``, its decode speed while busy at its depth (``streamed``)."""

    def decoding(self) -> None:
        """Its first token: from now on it decodes beside the others (once; later calls do
        nothing)."""
        if self.decoding_from is None:
            self.mix_mark = self.backend.mix_mark(self.profile)
            self.backend.begin(self.profile)
            self.decoding_from = self.backend.single_depth_seconds(self.profile)
            self.slots_from = self.backend.single_depth_slot_seconds(self.profile)

    def streamed(self, chunk: bytes) -> None:
        """A chunk of its stream arrived: its first marks ``decoding``; each one's events count
        toward ``single_depth_events`` while the process is busy at its profile only. Events,
        not the tokens the final timings report: a request that also ran alone or beside
        another depth decodes faster or slower there, and its whole-run speed weighted by its
        busy seconds carried that into the busy comparison (an exploring epoch begins on an
        idle process, so its requests ran partly alone: setup-b's depth 3 measured 34-85 tok/s
        where it decodes at 19-28 beside others). llama-server sends one event per token;
        an event ends with a blank line, which JSON text cannot hold."""
        self.decoding()
        if self.backend.busy_at(self.profile):
            self.single_depth_events += chunk.count(b"\n\n") + chunk.count(b"\r\n\r\n")

    @property
    def ran_mixed(self) -> bool:
        """Whether it decoded beside another profile at any time (or never decoded)."""
        return self.decoding_from is None or self.backend.ran_mixed(self.mix_mark)

    def single_depth_s(self) -> float:
        """How long it has decoded while the process was busy at its profile only."""
        if self.decoding_from is None:
            return 0.0
        return self.backend.single_depth_seconds(self.profile) - self.decoding_from

    def single_depth_load(self) -> float:
        """How many requests decoded together, on average, over its ``single_depth_s`` (itself
        included); 0 without any such time."""
        seconds = self.single_depth_s()
        if seconds <= 0:
            return 0.0
        return (self.backend.single_depth_slot_seconds(self.profile) - self.slots_from) / seconds

"""The proxy's live view of its backends: readiness pushed by the supervisor, load counted here.

The supervisor reports every state change through `LiveBackends.on_change` at once, so a request
is never sent to a backend that is not ready. In-flight counts are the proxy's own: the policy
uses them to spill load, and the supervisor reads them to drain a backend before stopping it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
    generation: int = 0
    """Times it became ready: a request that failed on one process may try its successor."""

    @property
    def ready(self) -> bool:
        return self.state == BackendState.READY and self.base_url is not None

    @property
    def has_room(self) -> bool:
        return self.ready and self.in_flight < self.slots

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

    def slots_of(self, model: str) -> tuple[int, int]:
        """(slots of the ready backends of `model`, requests in flight on all its backends):
        the load /health and the vLLM-named gauges show a balancer."""
        total = sum(b.slots for b in self.ready_of_model(model))
        return total, sum(b.in_flight for b in self.of_model(model))

    def all(self) -> list[LiveBackend]:
        return list(self._backends.values())

    def in_flight(self, name: str) -> int:
        backend = self._backends.get(name)
        return backend.in_flight if backend else 0

    @contextmanager
    def lease(self, backend: LiveBackend) -> Iterator[None]:
        """Count a request against ``backend`` for as long as it is being served."""
        backend.in_flight += 1
        backend.started_total += 1
        try:
            yield
        finally:
            backend.in_flight -= 1

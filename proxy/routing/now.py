"""Read-only: the busy epoch each process on per-request depths is in now (routing.busy), and its
depth.

For the live page (/admin/depths), `mtp-proxy status` and the metric
``mtp_proxy_backend_busy_depth``. It reads the router's state and changes nothing: the epoch's
next depth is still chosen where requests are routed (``BusyEpochs.depth``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from proxy.routing.router import Router
from proxy.routing.views import BackendView

V = TypeVar("V", bound=BackendView)


@dataclass(frozen=True, slots=True)
class BusyEpoch:
    """What a request admitted beside others on ``backend`` runs at now."""

    backend: str
    model: str
    profile: str
    depth: int
    left: int
    """Admissions left in the epoch; at 0 the next admission beside others picks the next."""
    exploring: bool
    """The epoch measures the other depth while the comparison is still open."""
    samples: dict[str, float]
    """Requests' worth of decode speeds measured per profile while busy at it alone."""

    def as_json(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "depth": self.depth,
            "left": max(self.left, 0),
            "exploring": self.exploring,
            "samples": self.samples,
        }


def busy_epochs(router: Router[V]) -> dict[str, BusyEpoch]:
    """Backend name -> its busy epoch, for the processes on per-request depths that were busy."""
    epochs = {}
    for name, busy in router.stats.busy.items():
        backend = router.backends.get(name)
        if busy.profile is None or backend is None:
            continue
        per_request = router.per_request.get(backend.model)
        if per_request is None or busy.profile not in per_request.depths:
            continue  # the model's shape changed (auto's fallback) or its profiles did
        samples = busy.report()["samples"]
        epochs[name] = BusyEpoch(
            name,
            backend.model,
            busy.profile,
            per_request.depths[busy.profile],
            busy.left,
            busy.exploring,
            dict(samples) if isinstance(samples, dict) else {},
        )
    return epochs

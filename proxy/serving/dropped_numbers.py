"""A backend's answers whose numbers routing refused to learn (``proxy.routing.plausibility``):
each counted, and logged at most once per backend per minute.

A backend that answers impossible numbers usually answers them every time (a buggy build, a
program that is not llama-server): one warning a minute says so, with how many were dropped
since the last one, without a line per request.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import structlog

from proxy.observability.metrics import ProxyMetrics
from proxy.routing.telemetry import Observation, ParsedUsage

LOG_INTERVAL_S = 60.0
log = structlog.get_logger("proxy.routing")


class DroppedNumbers:
    """Per backend: when its dropped answers were last logged, and how many were dropped since."""

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval_s, self._clock = interval_s, clock
        self._logged: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def record(
        self, metrics: ProxyMetrics, model: str, observation: Observation, usage: ParsedUsage
    ) -> None:
        """Count a dropped observation; log it if its backend's last such line is a minute old."""
        reason, backend = observation.dropped or "unknown", observation.backend
        metrics.observations_dropped.labels(model, reason).inc()
        self._since[backend] = since = self._since.get(backend, 0) + 1
        now, last = self._clock(), self._logged.get(backend)
        if last is not None and now - last < self._interval_s:
            return
        self._logged[backend], self._since[backend] = now, 0
        numbers = {k: v for k, v in dataclasses.asdict(usage).items() if v is not None}
        log.warning(
            "backend_numbers_dropped",
            backend=backend,
            model=model,
            reason=reason,
            dropped_since_last_line=since,
            numbers=numbers,
            learned="nothing from these answers; what was learned before stays",
        )

"""Routing glue (interim): least in-flight among ready backends. Replaced by the adaptive policy."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.forward import Relayed
from proxy.pool import BackendPool, BackendSlot
from proxy.routing_settings import RoutingSettings


@dataclass(frozen=True)
class Route:
    backend: BackendSlot
    profile: str
    reason: str
    request_class: str


@dataclass(frozen=True)
class LearnedRow:
    model: str
    request_class: str
    profile: str
    decode_tok_s: float
    acceptance: float
    samples: float


class _NullSink:
    def feed(self, chunk: bytes) -> None:
        pass


class Router:
    def __init__(self, settings: RoutingSettings, pool: BackendPool) -> None:
        self.settings = settings
        self.pool = pool

    def features(
        self, api: str, model: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> None:
        return None

    def route(self, model: str, features: None, *, exclude: Collection[str]) -> Route | None:
        ready = [b for b in self.pool.ready_of_model(model) if b.name not in exclude]
        if not ready:
            return None
        backend = min(ready, key=lambda b: b.in_flight)
        return Route(backend, backend.profile, "fallback", "-")

    def stream_telemetry(self, api: str) -> _NullSink:
        return _NullSink()

    def record(
        self,
        route: Route,
        features: None,
        relayed: Relayed,
        sink: object,
        *,
        received: float,
        elapsed: float,
    ) -> dict[str, Any]:
        return {}

    def learned_rows(self) -> list[LearnedRow]:
        return []

    def snapshot(self) -> dict[str, Any]:
        return {"classes": []}

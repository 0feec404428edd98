"""One generation request: route, forward (retrying before the first byte), relay, record."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web
from structlog.typing import FilteringBoundLogger

from proxy.errors import error_response
from proxy.features import Api
from proxy.forward import (
    Relayed,
    UpstreamUnavailable,
    is_event_stream,
    open_upstream,
    relay_body,
    relay_stream,
    upstream_headers,
)
from proxy.router import Route
from proxy.state import ProxyState

_RETRY_AFTER_S = 2.0


class Exchange:
    def __init__(
        self,
        state: ProxyState,
        request: web.Request,
        api: Api,
        model: str,
        raw: bytes,
        body: dict[str, Any],
        received: float,
        log: FilteringBoundLogger,
    ) -> None:
        self.state, self.request, self.api, self.model = state, request, api, model
        self.raw, self.body, self.received, self.log = raw, body, received, log
        self.dialect = "anthropic" if api == "messages" else "openai"
        self.features = state.router.features(api, model, body, request.headers)

    async def run(self) -> web.StreamResponse:
        tried: set[str] = set()
        for _ in range(1 + self.state.settings.server.retry_before_first_byte):
            route = self.state.router.route(self.model, self.features, exclude=tried)
            if route is None:
                break
            try:
                return await self._attempt(route)
            except UpstreamUnavailable as exc:
                tried.add(route.backend.name)
                self.state.metrics.retries.labels(self.model).inc()
                self.log.warning("upstream_unavailable", backend=route.backend.name, error=str(exc))
        return self._unavailable(tried)

    def _unavailable(self, tried: set[str]) -> web.Response:
        status = 502 if tried else 503
        message = (
            f"every backend tried failed before answering ({', '.join(sorted(tried))})"
            if tried
            else f"no backend of model {self.model!r} is ready; retry shortly"
        )
        self._count("none", "-", status)
        self.log.info("request", model=self.model, status=status, error=message)
        return error_response(self.dialect, status, message, retry_after=_RETRY_AFTER_S)  # type: ignore[arg-type]

    async def _attempt(self, route: Route) -> web.StreamResponse:
        state = self.state
        backend = route.backend
        headers = upstream_headers(
            self.request.headers, forward_auth=state.settings.server.forward_client_auth
        )
        url = f"{backend.base_url}{self.request.path_qs}"
        with state.pool.lease(backend):
            state.metrics.overhead.labels(self.api).observe(time.perf_counter() - self.received)
            response = await open_upstream(state.client(), url, self.raw, headers, state.timeouts)
            async with response:
                out, relayed = await self._relay(response, route)
        self._record(route, relayed)
        return out

    async def _relay(
        self, response: aiohttp.ClientResponse, route: Route
    ) -> tuple[web.StreamResponse, Relayed]:
        extra = {
            "X-MTP-Profile": route.profile,
            "X-MTP-Route-Reason": route.reason,
            "X-MTP-Backend": route.backend.name,
        }
        idle = self.state.timeouts.idle_s
        if is_event_stream(response):
            self.sink = self.state.router.stream_telemetry(self.api)
            return await relay_stream(
                self.request, response, extra, api=self.api, sink=self.sink, idle_s=idle
            )
        self.sink = None
        return await relay_body(response, extra, idle)

    def _record(self, route: Route, relayed: Relayed) -> None:
        elapsed = time.perf_counter() - self.received
        summary = self.state.router.record(
            route, self.features, relayed, self.sink, received=self.received, elapsed=elapsed
        )
        if relayed.upstream_error:
            self.state.metrics.upstream_failures.labels(self.model, route.profile).inc()
        self._count(route.profile, route.request_class, relayed.status)
        self.state.metrics.latency.labels(self.model, self.api, route.profile).observe(elapsed)
        self.log.info(
            "request",
            model=self.model,
            profile=route.profile,
            backend=route.backend.name,
            request_class=route.request_class,
            reason=route.reason,
            status=relayed.status,
            stream=relayed.streamed,
            duration_s=round(elapsed, 4),
            upstream_error=relayed.upstream_error,
            **summary,
        )

    def _count(self, profile: str, request_class: str, status: int) -> None:
        self.state.metrics.requests.labels(
            self.model, self.api, profile, request_class, str(status)
        ).inc()

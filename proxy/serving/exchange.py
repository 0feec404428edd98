"""One generation request: route, forward (retrying before the first byte), relay, record."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from structlog.typing import FilteringBoundLogger

from proxy.apis import CLIENT_CLOSED, DEPTH_KEY, Api, dialect_of
from proxy.compat.request import Chained, RequestMends, Rewriter
from proxy.observability.request_log import LOGGED, request_id, request_logger
from proxy.routing.depth_clock import DepthRecord
from proxy.routing.router import LEVEL_ANY, Outcome, Route
from proxy.routing.telemetry import (
    Observation,
    ParsedUsage,
    SpecCounters,
    StreamTelemetry,
    parse_body,
)
from proxy.serving.admission import QueueRefused
from proxy.serving.backends import LiveBackend
from proxy.serving.depth_field import with_depth, with_integer
from proxy.serving.depth_headers import depth_headers
from proxy.serving.errors import error_response
from proxy.serving.forward import (
    Relayed,
    UpstreamUnavailable,
    is_event_stream,
    open_upstream,
    relay_body,
    relay_stream,
    sent,
    upstream_headers,
    upstream_url,
)
from proxy.serving.responses_events import ResponsesEventIndexer
from proxy.serving.side_requests import SLOT_KEY, side_rule, slot_of
from proxy.state import ProxyState

_RETRY_AFTER_S = 2.0
_HOLDER_LANE = "\x01"  # admission lane of requests waiting for one backend (no profile has it)
# Answers without per-request draft counts: acceptance comes from the backend's /metrics.
_NO_TIMINGS = frozenset({"messages", "responses"})


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
        mends: RequestMends,
    ) -> None:
        self.state, self.request, self.api, self.model = state, request, api, model
        self.raw, self.received = raw, received
        self.mends = mends  # proxy.compat: the bytes each backend gets, the answer's rewrite
        self.dialect = dialect_of(api)
        self.features = state.router.features(api, model, body, request.headers)
        self.features_model = body.get("model")
        self.sink: StreamTelemetry | None = None
        self.route: Route[LiveBackend] | None = None
        self.relayed: Relayed | None = None  # the current attempt's, once its answer started
        self.sent_at = received
        self.sequence = 0
        request[LOGGED] = True  # every way out of an exchange writes the request's line
        self.own_depth = DEPTH_KEY in body  # the client chose its depth: it is not replaced
        self.side, self.own_slot = self._side_request(body)
        self.slot: int | None = None  # the id_slot it was sent with (proxy.serving.side_requests)
        depth = body.get(DEPTH_KEY)
        self.client_depth = None if isinstance(depth, bool) or not isinstance(depth, int) else depth
        self.depth_run = DepthRecord()  # what its run says about its depth (routing.depth_clock)
        self.others_at_end: int | None = None  # requests on its backend when it ended
        self.counters: asyncio.Task[SpecCounters | None] | None = None  # serving.spec_counters
        self.failed: dict[str, int] = {}  # backend -> generation that failed before answering
        self._rechecks: dict[str, asyncio.TimerHandle] = {}  # ... to be tried again at its end
        self._rechecked: set[str] = set()  # ... that may be tried again: still serving then

    def _side_request(self, body: dict[str, Any]) -> tuple[str | None, bool]:
        """(the rule that makes it a side request, or None; whether the client chose its own
        slot). Only with a slot kept for side requests; a main turn with tools and a session
        key makes that session the model's live agent."""
        settings = self.state.settings.side_requests
        if settings.slot is None:
            return None, False
        live = self.state.live_agents
        named = self.features_model if isinstance(self.features_model, str) else ""
        rule = side_rule(self.features, named, live.get(self.model), settings)
        if rule is None and self.features.has_tools and self.features.session_key is not None:
            live[self.model] = self.features.session_key
        return rule, SLOT_KEY in body

    @functools.cached_property
    def log(self) -> FilteringBoundLogger:
        """Bound at the first line about the request, in the deferred bookkeeping for most:
        binding it up front cost the forward path ~35 us on a cold CPU."""
        return request_logger(self.request, self.api)

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        # The client went away: aiohttp cancels the handler, or a write to it fails first.
        except (asyncio.CancelledError, ConnectionError):
            self._abandoned()
            raise
        finally:
            for handle in self._rechecks.values():
                handle.cancel()

    async def _run(self) -> web.StreamResponse:
        tried: set[str] = set()
        for _ in range(1 + self.state.settings.server.retry_before_first_byte):
            tried = self._excluded()
            if not self._others_ready(tried) and not self._may_wait(tried):
                break  # nothing (else) to wait for: say so at once
            refusal = await self._admit(tried)
            if refusal is not None:
                return refusal
            tried = self._excluded()
            try:
                route = self.state.router.route(self.model, self.features, exclude=tried)
                if route is None:
                    continue  # the slot went to another request between wake-up and routing
                if self.own_depth:  # it runs at its own depth: leased and labelled so
                    route = self.state.router.client_depth(self.model, route, self.client_depth)
                self.route = route
                self.state.metrics.decisions.labels(self.model, route.reason, route.profile).inc()
                if not route.backend.has_room and (refusal := await self._wait_for(route)):
                    return refusal
                try:
                    return await self._attempt(route)
                except UpstreamUnavailable as exc:
                    self._failed_on(route.backend.name, route.backend.generation)
                    tried = self._excluded()
                    self.state.metrics.retries.labels(self.model).inc()
                    self.log.warning(
                        "upstream_unavailable",
                        backend=route.backend.name,
                        error=str(exc),
                        recheck_s=self._recheck_s(),
                    )
            finally:
                self.state.admission.notify(self.model, self.state.backends.free_slots(self.model))
        return self._unavailable(tried)

    def _others_ready(self, tried: set[str]) -> bool:
        return any(b.name not in tried for b in self.state.backends.ready_of_model(self.model))

    def _excluded(self) -> set[str]:
        """Backends that failed this request, as long as the same process runs there: one
        that restarted since (a new generation) may be tried again, and so may a model's own
        process that still serves ``_recheck_s`` after the failure."""
        backends = self.state.backends
        return {
            name
            for name, generation in self.failed.items()
            if (backend := backends.get(name)) is None
            or (backend.generation == generation and name not in self._rechecked)
        }

    def _recheck_s(self) -> float | None:
        """How long a model served by one process (per replica) waits before it tries a process
        that failed this request before answering and still serves: by then the supervisor
        would have taken it out of service had it stopped answering /health (a hung process:
        ``unhealthy_after_s``, plus the check that finds it). A process still serving then
        failed this request alone (a connection lost on the way); waiting for a restart that
        never comes held it to the queue timeout, refused as if there were no capacity. None:
        a model of several profiles tries the others, and fails when none is left."""
        if self.model not in self.state.router.per_request:
            return None
        checks = self.state.settings.supervisor
        return checks.unhealthy_after_s + checks.health_interval_s + checks.health_timeout_s

    def _failed_on(self, backend: str, generation: int) -> None:
        self.failed[backend] = generation
        self._rechecked.discard(backend)
        if (earlier := self._rechecks.pop(backend, None)) is not None:
            earlier.cancel()  # an earlier process's failure: this one gets its own time
        recheck = self._recheck_s()
        if recheck is not None:
            loop = asyncio.get_running_loop()
            self._rechecks[backend] = loop.call_later(recheck, self._recheck, backend)

    def _recheck(self, backend: str) -> None:
        """The process that failed this request still serves, or is out of service by now:
        it may be tried again (``has_room`` tells which), and the queue is woken for it, since
        nothing else may wake it meanwhile (an idle process)."""
        self._rechecks.pop(backend, None)
        self._rechecked.add(backend)
        state = self.state
        state.admission.notify(self.model, state.backends.free_slots(self.model))

    def _may_wait(self, tried: set[str]) -> bool:
        """A model served by one process (per replica) waits in its queue while the process
        (re)starts, bounded by the queue timeout, rather than failing at once; so does one whose
        shape is being changed (auto falling back to the pool)."""
        state = self.state
        if self.model not in state.router.per_request and self.model not in state.replanning:
            return False
        # A process that just failed this request still looks ready until the supervisor sees
        # it exit: it comes back too (a new generation), unless it was given up (FAILED).
        return any(
            b.coming_back or (b.ready and b.name in tried)
            for b in state.backends.of_model(self.model)
        )

    async def _admit(self, tried: set[str]) -> web.Response | None:
        """Wait in line for a free slot on a backend not yet tried; a 429 if there is none."""
        state = self.state
        # Pinned to a ready profile: it waits for a slot of that profile, in a lane of its own.
        pinned = state.router.pinned_profile(self.model, self.features, tried)

        def has_room() -> bool:
            excluded = self._excluded() if self.failed else tried  # a restart lifts it
            return any(
                b.has_room and b.name not in excluded and (pinned is None or b.profile == pinned)
                for b in state.backends.ready_of_model(self.model)
            )

        try:
            await state.admission.admit(self.model, has_room, lane=pinned)
        except QueueRefused as refused:
            self._refused(429, str(refused))
            return error_response(
                self.dialect,
                429,
                f"too many requests queued: {refused}",
                retry_after=refused.retry_after_s,
            )
        return None

    async def _wait_for(self, route: Route[LiveBackend]) -> web.Response | None:
        """The policy kept a session on its cache holder although it is full (waiting there was
        judged cheaper than processing the prompt again elsewhere): wait here for a slot of it,
        in order, in a lane of its own, rather than send the request past its slots, where
        llama-server would queue it out of sight. A 429 past the queue's limits."""
        backend = route.backend
        try:
            await self.state.admission.admit(
                self.model, lambda: backend.has_room, lane=f"{_HOLDER_LANE}{backend.name}"
            )
        except QueueRefused as refused:
            self._refused(429, str(refused))
            message = f"too many requests queued: {refused}"
            return error_response(self.dialect, 429, message, retry_after=refused.retry_after_s)
        return None

    def _unavailable(self, tried: set[str]) -> web.Response:
        status = 502 if tried else 503
        message = (
            f"every backend tried failed before answering ({', '.join(sorted(tried))})"
            if tried
            else f"no backend of model {self.model!r} is ready; retry shortly"
        )
        self._refused(status, message)
        return error_response(self.dialect, status, message, retry_after=_RETRY_AFTER_S)

    async def _attempt(self, route: Route[LiveBackend]) -> web.StreamResponse:
        state = self.state
        backend = route.backend
        headers = upstream_headers(
            self.request.headers, forward_auth=state.settings.server.forward_client_auth
        )
        url = upstream_url(backend.base_url, self.request.raw_path)
        body = self._mended(backend.name)
        if route.depth is not None and not self.own_depth:
            body = with_depth(body, route.depth)
        side = self.state.settings.side_requests
        busy = backend.in_flight > 0
        side_request = self.side is not None
        self.slot = None if self.own_slot else slot_of(side_request, backend.slots, side, busy=busy)
        if self.slot is not None:
            body = with_integer(body, SLOT_KEY, self.slot)
        prefill = self.features.stream
        with state.backends.lease(backend), state.router.running(route, prefill=prefill) as run:
            self.sequence = sequence = backend.started_total
            self.sent_at = sent_at = time.perf_counter()
            response = await open_upstream(state.client(), url, body, headers, state.timeouts)
            async with response:
                out, relayed = await self._relay(response, route, run.streamed)
            self.depth_run = run.record()
        # Read now, not in the deferred bookkeeping: by then a client that sends its next
        # request at once (one person's agent) has it in flight, and a request that ran alone
        # was learned as one that ran beside another (routing.router, load levels).
        self.others_at_end = backend.in_flight
        if self.api in _NO_TIMINGS and relayed.status < 400 and not relayed.upstream_error:
            # Before the answer goes on: a client's next request must not be on the backend
            # before the reading is asked for (serving.spec_counters).
            self.counters = state.spec_counters.after(state.client(), backend, sequence)
        if relayed.status < 400:  # errors go back through the middleware that reshapes them
            await self._send(out)
        done_at = time.perf_counter()
        state.bookkeeping.defer(lambda: self._record(route, relayed, sent_at, done_at))
        return out

    def _mended(self, backend: str) -> bytes:
        """The body for this backend (proxy.compat); one it cannot mend goes as it came."""
        mends = self.mends
        raw = mends.raw_for(backend)
        if mends.unmended is not None and raw is self.raw:
            self.log.warning("request_not_mended", backend=backend, reason=mends.unmended)
        return raw

    async def _send(self, out: web.StreamResponse) -> None:
        """Write a complete answer now: the bookkeeping (telemetry, metrics, the log line) is
        deferred (proxy.observability.bookkeeping), and aiohttp would otherwise write it only
        after the handler returned."""
        if out.prepared:
            return  # a stream, or a large answer relayed as it came: already sent
        send_s = self.state.timeouts.send_s
        with contextlib.suppress(ConnectionError):  # the client left; the request still counts
            await sent(self.request, out.prepare(self.request), send_s)
            await sent(self.request, out.write_eof(), send_s)

    async def _relay(
        self,
        response: aiohttp.ClientResponse,
        route: Route[LiveBackend],
        on_chunk: Callable[[bytes], None],
    ) -> tuple[web.StreamResponse, Relayed]:
        extra = {
            "X-MTP-Profile": route.profile,
            "X-MTP-Route-Reason": route.reason,
            "X-MTP-Backend": route.backend.name,
            **depth_headers(
                self.state.settings,
                self.state.speculation,
                model=self.model,
                profile=route.profile,
                backend=route.backend.name,
                depth=route.depth,
            ),
        }
        timeouts = self.state.timeouts
        if is_event_stream(response):
            self.sink = StreamTelemetry(self.api)
            self.relayed = Relayed(status=response.status, streamed=True)
            indexer: Rewriter | None = None
            if self.api == "responses" and self.state.settings.compat.responses_stream_indices:
                indexer = ResponsesEventIndexer(self._requested_model())
            mend = self.mends.stream_rewriter()  # before the indexer: it drops events
            if mend is not None:
                indexer = Chained(mend, indexer) if indexer is not None else mend
            return await relay_stream(
                self.request,
                response,
                extra,
                api=self.api,
                sink=self.sink,
                timeouts=timeouts,
                relayed=self.relayed,
                rewriter=indexer,
                on_chunk=on_chunk,
            )
        out, relayed = await relay_body(self.request, response, extra, timeouts)
        if self.mends.tools and response.status == 200:
            self._mend_answer(out)
        return out, relayed

    def _mend_answer(self, out: web.StreamResponse) -> None:
        """Rewrite a complete answer as the client expects it (proxy.compat). Only one still
        held whole can be: a large one was relayed as it came, never held."""
        if isinstance(out, web.Response) and isinstance(out.body, bytes) and not out.prepared:
            out.body = self.mends.answer_body(out.body)
        else:
            self.log.warning("answer_not_mended", reason="too large: relayed as it came")

    def _requested_model(self) -> str:
        named = self.features_model
        return named if isinstance(named, str) and named else self.model

    def _record(
        self,
        route: Route[LiveBackend],
        relayed: Relayed,
        sent_at: float,
        done_at: float,
    ) -> None:
        state = self.state
        state.metrics.overhead.labels(self.api).observe(sent_at - self.received)
        sink = self.sink if relayed.streamed else None
        usage = sink.result(done_at) if sink is not None else parse_body(self.api, relayed.body)
        self._count(route.profile, route.class_label, relayed.status)
        elapsed = done_at - self.received
        state.metrics.latency.labels(self.model, self.api, route.profile).observe(elapsed)
        if relayed.first_chunk_at is not None:
            ttft = relayed.first_chunk_at - self.received
            state.metrics.ttft.labels(self.model, self.api, route.profile).observe(ttft)
        if relayed.upstream_error:
            state.metrics.upstream_failures.labels(self.model, route.profile).inc()
        if relayed.status != 200:
            self._log(route, relayed, elapsed, usage, None)
        elif self.api in _NO_TIMINGS and not usage.has_timings:
            # Reading /metrics takes a round trip: done after the answer went out, and the
            # request's log line waits for it so that it carries the acceptance.
            task = asyncio.get_running_loop().create_task(
                self._observe_with_counters(route, relayed, elapsed, usage, sent_at)
            )
            state.background.add(task)
            task.add_done_callback(state.background.discard)
        else:
            observation = self._observe(route, usage, sent_at, done_at)
            self._log(route, relayed, elapsed, usage, observation)

    async def _observe_with_counters(
        self,
        route: Route[LiveBackend],
        relayed: Relayed,
        elapsed: float,
        usage: ParsedUsage,
        sent_at: float,
    ) -> None:
        done_at = self.received + elapsed
        delta = await self.counters if self.counters is not None else None
        observation = self._observe(route, usage, sent_at, done_at, delta)
        self._log(route, relayed, elapsed, usage, observation)

    def _observe(
        self,
        route: Route[LiveBackend],
        usage: ParsedUsage,
        sent_at: float,
        done_at: float,
        spec_delta: SpecCounters | None = None,
    ) -> Observation:
        outcome = Outcome(
            route,
            self.features,
            usage,
            sent_at,
            done_at,
            self.depth_run,
            self.others_at_end,
            spec_delta,
        )
        observation = self.state.router.observe(outcome)
        if observation.dropped is not None:
            self.state.dropped.record(self.state.metrics, self.model, observation, usage)
        level = str(route.level or LEVEL_ANY)
        self.state.metrics.record_observation(self.model, route.profile, observation, level)
        return observation

    def _log(
        self,
        route: Route[LiveBackend],
        relayed: Relayed,
        elapsed: float,
        usage: ParsedUsage,
        observation: Observation | None,
    ) -> None:
        fields: dict[str, Any] = {}
        if observation is not None:
            fields = {
                "context_tokens": observation.context_tokens,
                "cached_tokens": observation.cached_tokens,
                "output_tokens": observation.output_tokens,
                "draft_n": observation.draft_n,
                "draft_accepted": observation.draft_n_accepted,
                "acceptance": observation.acceptance,
                "decode_tok_s": observation.decode_tok_s,
                "ttft_s": observation.ttft_s,
                **({"dropped": observation.dropped} if observation.dropped else {}),
            }
        else:
            fields = {"output_tokens": usage.output_tokens or usage.predicted_n}
        self.log.info(
            "request",
            **self._where(route),
            detail=route.detail,
            status=relayed.status,
            stream=relayed.streamed,
            duration_s=round(elapsed, 4),
            upstream_error=relayed.upstream_error,
            est_prompt_tokens=self.features.est_prompt_tokens,
            kind=self.features.kind,
            **({"mended": self.mends.applied} if self.mends.applied else {}),
            **({"side_request": self.side} if self.side is not None else {}),
            **({"id_slot": self.slot} if self.slot is not None else {}),
            **fields,
        )
        output = None if observation is not None else usage.output_tokens or usage.predicted_n
        self._keep(relayed.status, elapsed, route, observation, relayed.streamed, output)

    def _abandoned(self) -> None:
        """The request still gets its count and log line, with where it went if it got that far."""
        message = "the client disconnected before its answer was complete"
        route, relayed = self.route, self.relayed
        if route is not None and relayed is not None and relayed.final_relayed:
            # The final event reached the client before it closed: a complete answer (Codex
            # closes right after response.completed), logged, counted and learned as one.
            done_at = relayed.last_chunk_at or time.perf_counter()
            sent_at, state = self.sent_at, self.state
            if self.api in _NO_TIMINGS:
                self.counters = state.spec_counters.after(
                    state.client(), route.backend, self.sequence
                )
            state.bookkeeping.defer(lambda: self._record(route, relayed, sent_at, done_at))
            return
        if route is None:
            self._refused(CLIENT_CLOSED, message)
            return
        elapsed = time.perf_counter() - self.received
        stream = self.sink is not None

        def record() -> None:
            self._count(route.profile, route.class_label, CLIENT_CLOSED)
            self.log.info(
                "request",
                **self._where(route),
                status=CLIENT_CLOSED,
                stream=stream,
                duration_s=round(elapsed, 4),
                error=message,
            )
            self._keep(CLIENT_CLOSED, elapsed, route, stream=stream, error=message)

        self.state.bookkeeping.defer(record)

    def _keep(
        self,
        status: int,
        elapsed: float,
        route: Route[LiveBackend] | None = None,
        observation: Observation | None = None,
        stream: bool = False,
        output_tokens: int | None = None,
        *,
        error: str | None = None,
    ) -> None:
        """The request among the live page's recent requests (proxy.observability.recent)."""
        self.state.recent.record(
            request_id(self.request),
            self.api,
            self.model,
            status,
            elapsed,
            stream,
            route,
            observation,
            session_key=self.features.session_key,
            own_depth=self.own_depth,
            client_depth=self.client_depth,
            output_tokens=output_tokens,
            error=error,
            sent_model=self.features_model if isinstance(self.features_model, str) else None,
        )

    def _where(self, route: Route[LiveBackend]) -> dict[str, str]:
        return {
            "model": self.model,
            "profile": route.profile,
            "backend": route.backend.name,
            "request_class": route.class_label,
            "load_level": str(route.level or LEVEL_ANY),
            "reason": route.reason,
        }

    def _refused(self, status: int, message: str) -> None:
        elapsed = time.perf_counter() - self.received

        def record() -> None:
            self.state.metrics.record_unrouted(self.api, status, elapsed, model=self.model)
            self.log.info("request", model=self.model, api=self.api, status=status, error=message)
            self._keep(status, elapsed, error=message)

        self.state.bookkeeping.defer(record)

    def _count(self, profile: str, request_class: str, status: int) -> None:
        self.state.metrics.requests.labels(
            self.model, self.api, profile, request_class, str(status)
        ).inc()

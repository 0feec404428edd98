"""llama-server's routes besides generation: forwarded, or refused when they change a backend.

Read-only and token-counting routes (`/tokenize`, `/v1/messages/count_tokens`, `/v1/embeddings`,
`GET /props`...) go to a ready backend of the model the body names (or the only/default model
when it names none), query string kept, answer relayed as it comes. They are not routed by the
policy: any ready backend of the model gives the same answer. Their bodies are read like a
generation's (proxy.serving.body: deadlines, size, gzip).

Those that compute on a backend's slots (`COMPUTED`: embeddings and reranking, which llama-server
runs as tasks of its slots) take a slot like a generation: they wait in the model's queue
(proxy.serving.admission) for a backend with room, 429 past it. Token counting, tokenize and
templates run on llama-server's HTTP threads (its handle_count_tokens tokenizes, no slot) and
take none. `/infill` generates: it is a generation route (proxy.apis), routed with a depth.

Routes that change a backend's state (`POST /props`, `/slots` and its actions, `POST
/lora-adapters`, the router's `/models/load`...) would let one client change what every other
client gets: they answer 403 in the OpenAI error shape and never reach a backend.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.apis import Dialect, dialect_of_path, twins
from proxy.compat.request import counted_body
from proxy.observability.access_log import LOG_FIELDS
from proxy.observability.metrics import UNROUTED
from proxy.serving.admission import QueueRefused
from proxy.serving.backends import LiveBackend
from proxy.serving.body import BodyLimits, BodyRefused, read_body
from proxy.serving.body_items import ItemLimits, TooManyItems, parse_bounded
from proxy.serving.errors import error_response
from proxy.serving.expect import expect_handler
from proxy.serving.forward import (
    UpstreamUnavailable,
    open_upstream,
    relay_body,
    relay_stream,
    upstream_headers,
    upstream_url,
)
from proxy.serving.handlers import answer_and_close
from proxy.serving.model_names import unknown_model_message
from proxy.state import STATE, ProxyState

COMPUTED = frozenset({*twins("embeddings", "rerank", "reranking"), "/embedding"})
"""Forwarded routes that llama-server computes on its slots: they take one through admission."""
FORWARDED_POST = (
    "/v1/messages/count_tokens",
    *twins("responses/input_tokens", "chat/completions/input_tokens"),
    "/tokenize",
    "/detokenize",
    "/apply-template",
    *sorted(COMPUTED),
)
FORWARDED_GET = ("/props", "/lora-adapters")
_RETRY_AFTER_S = 2.0
# (method, path) pairs that change a backend's state; "*" is any method.
REFUSED = (
    ("POST", "/props"),
    ("*", "/slots"),
    ("*", "/slots/{id_slot}"),
    ("POST", "/lora-adapters"),
    ("POST", "/models"),
    ("DELETE", "/models"),
    ("*", "/models/load"),
    ("*", "/models/unload"),
    ("*", "/models/sse"),
    ("*", "/v1/chat/completions/control"),
)


class _NoSink:
    def feed(self, chunk: bytes, now: float | None = None) -> None:
        return None


def add_routes(app: web.Application) -> None:
    for path in FORWARDED_POST:
        app.router.add_post(path, forward, expect_handler=expect_handler)
    for path in FORWARDED_GET:
        app.router.add_get(path, forward, expect_handler=expect_handler)
    for method, path in REFUSED:
        app.router.add_route(method, path, refuse_state_change, expect_handler=expect_handler)


def _counted(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Count and time the answer in mtp_proxy_requests_total like a generation's, under the
    route's own path as its API (a fixed set) and profile and class "none"."""

    @functools.wraps(handler)
    async def counted(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        response = await handler(request)
        model = request.get(LOG_FIELDS, {}).get("model", UNROUTED)
        resource = request.match_info.route.resource
        api = resource.canonical if resource is not None else request.path
        request.app[STATE].metrics.record_unrouted(
            api, response.status, time.perf_counter() - started, model=model
        )
        return response

    return counted


@_counted
async def refuse_state_change(request: web.Request) -> web.StreamResponse:
    message = (
        f"{request.method} {request.path} changes a backend's state; mtp-proxy does not "
        "let clients reach it (manage backends through the config and /admin)"
    )
    return error_response("openai", 403, message, code="forbidden")


@_counted
async def forward(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    dialect = dialect_of_path(request.path)
    try:
        raw = await read_body(
            request, BodyLimits.of(state.settings.server), inflating=state.inflating
        )
    except BodyRefused as refused:
        response = error_response(dialect, refused.status, refused.message)
        if refused.status in (400, 408):  # the connection's framing or client is broken
            await answer_and_close(request, response)
        return response
    try:  # held to the item caps like a generation's (proxy.serving.body_items)
        parsed = await _parsed(raw, state)
    except TooManyItems as exc:
        return error_response(dialect, 413, str(exc))
    named = parsed.get("model") if isinstance(parsed, dict) else request.query.get("model")
    model = state.models.resolve(named)
    if model is None:
        return error_response(dialect, 404, unknown_model_message(named), code="model_not_found")
    request[LOG_FIELDS] = {"model": model}
    if request.path in COMPUTED:  # none counts tokens: their bodies go as they came
        return await _forward_computed(request, state, model, raw, dialect)
    checked = state.late_system.get  # a token count is mended as its generation would be
    for backend in _candidates(state.backends.ready_of_model(model)):
        request[LOG_FIELDS]["backend"] = backend.name
        body = counted_body(state.settings.compat, request.path, raw, parsed, backend.name, checked)
        try:
            return await _relay(request, backend, body)
        except UpstreamUnavailable:
            continue
    return _unavailable(dialect, model)


def _unavailable(dialect: Dialect, model: str) -> web.Response:
    message = f"no backend of model {model!r} is ready; retry shortly"
    return error_response(dialect, 503, message, retry_after=_RETRY_AFTER_S)


async def _forward_computed(
    request: web.Request, state: ProxyState, model: str, raw: bytes, dialect: Dialect
) -> web.StreamResponse:
    """A route that runs on a slot: wait in the model's queue for a backend with room, hold
    one of its slots while the answer is relayed, try another backend if it fails first."""
    tried: set[str] = set()
    backends = state.backends

    def with_room() -> list[LiveBackend]:
        return [b for b in backends.ready_of_model(model) if b.has_room and b.name not in tried]

    for _ in range(3):
        if not any(b.name not in tried for b in backends.ready_of_model(model)):
            break
        try:
            await state.admission.admit(model, lambda: bool(with_room()))
        except QueueRefused as refused:
            message = f"too many requests queued: {refused}"
            return error_response(dialect, 429, message, retry_after=refused.retry_after_s)
        try:
            free = with_room()
            if not free:
                continue  # the slot went to another request between wake-up and now
            backend = _candidates(free)[0]
            request[LOG_FIELDS]["backend"] = backend.name
            # It decodes at no depth, but holds a slot until its answer is out.
            with backends.lease(backend):
                return await _relay(request, backend, raw)
        except UpstreamUnavailable:
            tried.add(backend.name)
        finally:
            state.admission.notify(model, backends.free_slots(model))
    return _unavailable(dialect, model)


async def _parsed(raw: bytes, state: ProxyState) -> Any:
    """The body parsed, None when there is none or it is no JSON (the backend judges it; the
    only or default model gets it); TooManyItems past a cap."""
    if not raw:
        return None
    try:
        return await parse_bounded(raw, ItemLimits.of(state.settings.server), state.parsing)
    except orjson.JSONDecodeError:
        return None


def _candidates(ready: list[LiveBackend]) -> list[LiveBackend]:
    """Most free slots first, at most three tries."""
    return sorted(ready, key=lambda b: b.in_flight - b.slots)[:3]


async def _relay(request: web.Request, backend: LiveBackend, raw: bytes) -> web.StreamResponse:
    state = request.app[STATE]
    assert backend.base_url is not None  # ready backends have one
    headers = upstream_headers(
        request.headers, forward_auth=state.settings.server.forward_client_auth
    )
    url = upstream_url(backend.base_url, request.raw_path)
    started = time.perf_counter()
    response = await open_upstream(
        state.client(), url, raw, headers, state.timeouts, method=request.method
    )
    extra = {"X-MTP-Backend": backend.name}
    async with response:
        if response.content_type == "text/event-stream":
            out, _ = await relay_stream(
                request,
                response,
                extra,
                api="completions",
                sink=_NoSink(),
                timeouts=state.timeouts,
            )
            return out
        out, _ = await relay_body(request, response, extra, state.timeouts)
    request[LOG_FIELDS]["upstream_s"] = round(time.perf_counter() - started, 4)
    return out

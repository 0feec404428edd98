"""HTTP handlers: the four generation APIs, models, health and metrics.

Every generation request takes the same path: read and parse the body once, resolve the model,
ask the router for a backend, forward, relay, record. Errors answer in the called API's shape.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.apis import Api, dialect_of
from proxy.compat.request import RequestMends
from proxy.config.settings import Settings
from proxy.observability.request_log import LOGGED, request_id, request_logger
from proxy.serving.body import BodyLimits, BodyRefused, read_body
from proxy.serving.body_items import ItemLimits, TooManyItems, parse_bounded
from proxy.serving.errors import error_response
from proxy.serving.exchange import Exchange
from proxy.serving.model_names import unknown_model_message
from proxy.state import STATE, ProxyState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def generation_handler(api: Api) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await _generate(request, api)

    return handle


async def _generate(request: web.Request, api: Api) -> web.StreamResponse:
    state = request.app[STATE]
    received = time.perf_counter()
    try:
        raw = await read_body(
            request, BodyLimits.of(state.settings.server), inflating=state.inflating
        )
    except BodyRefused as refused:
        response = refuse(request, api, refused.status, refused.message, received)
        if refused.status in (400, 408):  # the connection's framing or client is broken
            await answer_and_close(request, response)
        return response
    if state.request_log.is_enabled_for(logging.DEBUG):
        request_logger(request, api).debug(
            "request_received", path=request.path, body_bytes=len(raw)
        )
    body = await _body(request, api, raw, received)
    if isinstance(body, web.Response):
        return body
    model = state.models.resolve(body.get("model"))
    if model is None:
        message = unknown_model_message(body.get("model"))
        return refuse(request, api, 404, message, received, code="model_not_found")
    pin_problem = unknown_pin(state.settings, model, request.headers)
    if pin_problem is not None:
        return refuse(request, api, 400, pin_problem, received, code="unknown_profile")
    mends = RequestMends(state.settings.compat, api, raw, body, state.late_system.get)
    if mends.refusal is not None:  # a field llama-server would silently drop (proxy.compat)
        return refuse(request, api, 400, mends.refusal, received)
    if request.path == "/infill":  # the router's view only: the mends saw the client's body
        body = infill_as_completion(body)
    exchange = Exchange(state, request, api, model, raw, body, received, mends)
    return await exchange.run()


def unknown_pin(settings: Settings, model: str, headers: Mapping[str, str]) -> str | None:
    """The refusal of a pin header naming no profile of the model (a typo would otherwise be
    routed as if unpinned, silently); None when there is no pin or it names one."""
    routing = settings.routing
    pin = headers.get(routing.pin_header)
    if not pin:
        return None
    names = next((m.profile_names() for m in settings.models if m.name == model), [])
    if routing.resolve_pin(pin) in names:
        return None
    return (
        f"unknown profile {pin[:100]!r} in the {routing.pin_header} header: model {model} "
        f"has the profiles {', '.join(names)}"
    )


async def answer_and_close(request: web.Request, response: web.Response) -> None:
    """Send `response` now and close the connection: aiohttp would otherwise keep reading
    the rest of the body for up to 10 s (lingering)."""
    response.force_close()
    with contextlib.suppress(ConnectionError):
        await response.prepare(request)
        await response.write_eof()
    if request.transport is not None:
        request.transport.close()


def refuse(
    request: web.Request,
    api: Api,
    status: int,
    message: str,
    received: float,
    *,
    code: str | None = None,
) -> web.Response:
    """Answer an error before routing, and still count, time and log the request."""
    elapsed = time.perf_counter() - received
    state = request.app[STATE]
    request[LOGGED] = True

    def record() -> None:
        state.metrics.record_unrouted(api, status, elapsed)
        request_logger(request, api).info(
            "request", status=status, error=message, duration_s=round(elapsed, 4)
        )
        if status != 401:  # the live page's recent requests: a client's, not anyone's
            rid = request_id(request)
            state.recent.record(rid, api, "none", status, elapsed, False, None, None, error=message)

    state.bookkeeping.defer(record)
    return error_response(dialect_of(api), status, message, code=code)


def infill_as_completion(body: dict[str, Any]) -> dict[str, Any]:
    """How the router sees an /infill body (the bytes forwarded are the client's): a completion
    whose prompt is the context chunks, the prefix, the prompt and the suffix, so that its
    size, and so its class, count them all."""
    extra = body.get("input_extra")
    extra = extra if isinstance(extra, list) else []
    chunks = [c.get("text") for c in extra if isinstance(c, dict)]
    parts = [*chunks, body.get("input_prefix"), body.get("prompt"), body.get("input_suffix")]
    return {**body, "prompt": [p for p in parts if isinstance(p, str)]}


async def _body(
    request: web.Request, api: Api, raw: bytes, received: float
) -> dict[str, Any] | web.Response:
    """The parsed body, held to the item caps before anything walks it (a large one parsed
    off the loop: proxy.serving.body_items), or the refusal."""
    state = request.app[STATE]
    try:
        parsed = await parse_bounded(raw, ItemLimits.of(state.settings.server), state.parsing)
    except TooManyItems as exc:
        return refuse(request, api, 413, str(exc), received)
    except orjson.JSONDecodeError as exc:
        return refuse(request, api, 400, _not_json(raw, exc), received)
    body, problem = _object(parsed)
    return refuse(request, api, 400, problem, received) if body is None else body


def _not_json(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    # orjson is ~3x faster than json on 100k-token prompts and stricter where llama-server
    # would answer 500: invalid UTF-8, lone surrogate escapes, nesting past 1024 levels.
    if not raw:
        return "request body is empty; expected a JSON object"
    return f"request body is not valid JSON: {str(exc)[:200]}"


def _object(parsed: Any) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(parsed, dict):
        return None, "request body must be a JSON object"
    problem = _token_limit_problem(parsed)
    return (None, problem) if problem else (parsed, "")


def _token_limit_problem(body: dict[str, Any]) -> str | None:
    for key in _TOKEN_LIMITS:
        value = body.get(key)
        # llama-server keeps these in 32-bit ints; past that the routing maths overflows too.
        if isinstance(value, int | float) and not _INT32_MIN <= value <= _INT32_MAX:
            return f"'{key}' is out of range (at most {_INT32_MAX})"
    return None


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    created = int(state.started_at)
    data = [
        {
            "id": name,
            "object": "model",
            "type": "model",
            "created": created,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
            "display_name": name,
            "owned_by": "mtp-proxy",
        }
        for name in state.models.all_names()
    ]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    payload = {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": first,
        "last_id": last,
    }
    return web.json_response(payload)


async def health(request: web.Request) -> web.Response:
    """The load view a balancer's health check reads (no key: it must stay cheap and open).
    503 while a model has no ready backend, and, with server.health_unavailable_when_full,
    while no slot of any model can take a request: the balancer sends new work elsewhere."""
    state = request.app[STATE]
    models = {m: _model_load(state, m) for m in state.models.primary_names()}
    ready = all(load["ready_backends"] for load in models.values())
    full = bool(models) and all(load["slots_free"] == 0 for load in models.values())
    status = "unavailable" if not ready else "ok"
    if ready and full and state.settings.server.health_unavailable_when_full:
        status = "full"
    payload: dict[str, object] = {
        "status": status,
        "ready_backends": {m: load["ready_backends"] for m, load in models.items()},
        "models": models,
    }
    waiting = {
        m: _not_ready_reason(state, m) for m, load in models.items() if not load["ready_backends"]
    }
    if waiting:
        payload["waiting"] = waiting
    return web.json_response(payload, status=200 if status == "ok" else 503)


def _model_load(state: ProxyState, model: str) -> dict[str, int]:
    total, busy = state.backends.slots_of(model)
    return {
        "ready_backends": len(state.backends.ready_of_model(model)),
        "slots_total": total,
        "slots_busy": busy,
        "slots_free": state.backends.free_slots(model),
        "requests_waiting": state.admission.queued(model),
    }


def _not_ready_reason(state: ProxyState, model: str) -> str:
    """Why a model has no ready backend yet, in words: the start-up calibration (which takes
    seconds, once), a process starting, or one that failed."""
    now = time.monotonic()
    backends = state.backends.of_model(model)
    for backend in backends:
        if (began := state.calibrating.get(backend.name)) is not None:
            return (
                f"calibrating: {backend.name} is measured at each depth before it serves "
                f"(once; routing.learned_file keeps the result), {now - began:.0f} s so far"
            )
    if model in state.replanning:
        return "its processes are being replaced (draft_control auto's fallback)"
    states = sorted({backend.state.value for backend in backends})
    return f"no backend ready: {', '.join(states) or 'none started'}"


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.bookkeeping.flush()  # every request answered so far is in the scrape
    body = generate_latest(state.registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response

"""HTTP handlers: the four generation APIs, models, health and metrics.

Every generation request takes the same path: read and parse the body once, resolve the model,
ask the router for a backend, forward, relay, record. Errors answer in the called API's shape.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.errors import Dialect, error_response
from proxy.exchange import Exchange
from proxy.features import Api
from proxy.state import STATE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_PATHS: dict[str, Api] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
_REQUEST_ID_CHARS = frozenset("0123456789abcdefABCDEF-")


def dialect_of(api: Api) -> Dialect:
    return "anthropic" if api == "messages" else "openai"


def generation_handler(api: Api) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await _generate(request, api)

    return handle


async def _generate(request: web.Request, api: Api) -> web.StreamResponse:
    state = request.app[STATE]
    received = time.perf_counter()
    dialect = dialect_of(api)
    log = structlog.get_logger("proxy.request").bind(request_id=_request_id(request), api=api)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = state.settings.server.max_body_bytes
        return error_response(dialect, 413, f"request body exceeds {limit} bytes")
    body, problem = _parse_object(raw)
    if body is None:
        return error_response(dialect, 400, problem)
    model = state.models.resolve(body.get("model"))
    if model is None:
        return error_response(
            dialect, 404, f"model {body.get('model')!r} does not exist", code="model_not_found"
        )
    exchange = Exchange(state, request, api, model, raw, body, received, log)
    return await exchange.run()


def _parse_object(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    if not raw:
        return None, "request body is empty; expected a JSON object"
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        return None, "request body is not valid UTF-8"
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"request body is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return None, "request body must be a JSON object"
    return body, ""


def _request_id(request: web.Request) -> str:
    given = request.headers.get("X-Request-Id", "")
    if 0 < len(given) <= 64 and set(given) <= _REQUEST_ID_CHARS:
        return given
    return uuid.uuid4().hex


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
    state = request.app[STATE]
    models = {m: len(state.pool.ready_of_model(m)) for m in state.models.primary_names()}
    ok = all(models.values())
    payload = {"status": "ok" if ok else "unavailable", "ready_backends": models}
    return web.json_response(payload, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response

"""What the simulator's HTTP handlers share: app keys, JSON helpers, llama-server's errors."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from aiohttp import web

from simulator.engine import Engine
from simulator.prompts import BadRequest

ENGINE = web.AppKey("engine", Engine)
READY_AT = web.AppKey("ready_at", float)  # loop time at which the "model" has loaded

dumps = partial(json.dumps, ensure_ascii=False, separators=(",", ":"))


def error_response(status: int, message: str, kind: str, **extra: Any) -> web.Response:
    """llama-server's (OpenAI-shaped) error body."""
    body = {"error": {"code": status, "message": message, "type": kind, **extra}}
    return web.json_response(body, status=status, dumps=dumps)


async def json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nesting deeper than the decoder's stack allows (where exactly depends
        # on the stack depth at the time, so it came and went); a client error, not a 500.
        raise BadRequest(f"Failed to parse JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def model_name(engine: Engine) -> str:
    cfg = engine.config
    return cfg.alias or cfg.model or engine.preset.model.name

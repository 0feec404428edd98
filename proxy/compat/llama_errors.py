"""llama-server's error answers, read: ``{"error": {"code", "type", "message", ...}}``."""

from __future__ import annotations

from typing import Any

import orjson


def llama_error(body: bytes) -> dict[str, Any] | None:
    """The ``error`` object of a llama-server error answer; None if ``body`` is not one."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else None

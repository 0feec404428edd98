"""One greedy, non-streamed completion asked of a llama-server for its timings.

The supervisor's draft-control probe and the routing brain's start-up calibration both measure a
backend this way before it serves: one POST to ``/v1/completions`` and the answer's ``timings``
object, or an error that says why there is none. What the caller reads from the timings (and
how it checks those numbers) stays the caller's.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

DEPTH_KEY = "speculative.n_max"  # the flat top-level key, as llama-server's schema names it
PATH = "/v1/completions"


class NoTimings(Exception):
    """The backend did not answer with timings (no answer, an error, not llama-server); the
    message says how, beginning with the request's ``what``."""


async def completion_timings(
    session: aiohttp.ClientSession, base_url: str, body: dict[str, Any], what: str
) -> dict[str, Any]:
    """POST ``body`` to the backend's /v1/completions; its answer's ``timings``, or NoTimings."""
    try:
        async with session.post(base_url.rstrip("/") + PATH, json=body) as response:
            text = await response.text(errors="replace")
            status = response.status
    except (aiohttp.ClientError, OSError) as exc:
        raise NoTimings(f"{what}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise NoTimings(f"{what} answered {status}: {text.strip()[:200]}")
    try:
        timings = json.loads(text)["timings"]
    except (ValueError, KeyError, TypeError):
        timings = None
    if not isinstance(timings, dict):
        raise NoTimings(f"{what}: the answer has no timings (not llama-server?)")
    return timings

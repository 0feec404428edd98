"""The per-request draft depth: the flat top-level key "speculative.n_max" of a request body.

As the project's patched llama-server treats it (patches/llama.cpp/README.md; the pinned sdist's
schema: docs/published-figures.md#per-request-depth): an integer 0 .. 2**31 - 1 (the schema's hard
limits; anything else is a 400 with the schema's message), null means "server default" (the schema
treats null as absent), 0 turns drafting off for this request, and a value above the start-up
--spec-draft-n-max is clamped to it. A nested {"speculative": {...}} is not the key and is ignored.
Stock llama-server compiles the key out and ignores it entirely (--ignore-request-draft).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from simulator.model import DraftSettings
from simulator.prompts import BadRequest

DEPTH_KEY = "speculative.n_max"
_INT32_MAX = 2**31 - 1


def requested_depth(body: dict[str, Any]) -> int | None:
    """The depth the request asks for, None if it asks for nothing. BadRequest if invalid."""
    value = body.get(DEPTH_KEY)
    if value is None:
        return None
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral:
        shown = json.dumps(value)
        raise BadRequest(f"Field '{DEPTH_KEY}': must be an integer, but got {shown}")
    depth = int(value)
    if not 0 <= depth <= _INT32_MAX:
        raise BadRequest(
            f"Field '{DEPTH_KEY}': Value must be between 0 <= value <= {_INT32_MAX},"
            f" but got {depth}"
        )
    return depth


def request_draft(process: DraftSettings, depth: int | None) -> DraftSettings:
    """What one request drafts in a process started with `process`: at most the start-up depth.

    Depth 0 keeps the spec type but drafts nothing (DraftSettings.enabled is False): the process
    still carries the MTP head, which the performance model charges separately.
    """
    if depth is None or not process.enabled:
        return process
    return replace(process, n_max=min(depth, process.n_max))

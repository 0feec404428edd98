"""Does a backend honour the per-request draft depth? A behavioural probe, run when it turns ready.

Nothing a llama-server reports says whether it reads ``"speculative.n_max"`` from a request
(stock llama.cpp 11434 ignores the key; the build from ``patches/llama.cpp`` honours it; /props
says nothing usable). So ask it: two short greedy completions with different prompts, one plain
and one with ``"speculative.n_max": 0``. The field is honoured iff only the plain one drafted
(``timings.draft_n``). A backend started without speculation, or whose plain answer drafted
nothing, has no draft to control. Any failure counts as ``ignored``, never as honoured, and
says why.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

DraftControl = Literal["per-request", "ignored", "none"]

DEPTH_KEY = "speculative.n_max"  # the flat top-level key, as llama-server's schema names it
_PATH = "/v1/completions"
# A few tokens are enough: the first draft comes right after the first sampled token.
_MAX_TOKENS = 8
# Two prompts, so the second answer cannot be a replay of the first from the prompt cache.
_PROMPTS = ("The quick brown fox", "Once upon a time")


@dataclass(frozen=True)
class DraftProbe:
    control: DraftControl
    reason: str  # what was seen, for the log and /admin/backends
    seconds: float
    failed: bool = False  # the backend did not answer usefully: control is "ignored"


class _ProbeFailed(Exception):
    """The backend did not answer the probe usefully; the message says how."""


async def probe_draft_control(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    speculative: bool,
    timeout_s: float,
) -> DraftProbe:
    """Ask the backend at base_url; ``speculative=False`` (known from its argv) needs no request."""
    started = time.monotonic()

    def result(control: DraftControl, reason: str, failed: bool = False) -> DraftProbe:
        return DraftProbe(control, reason, round(time.monotonic() - started, 3), failed)

    if not speculative:
        return result("none", "started without speculation (no --spec-type)")
    try:
        async with asyncio.timeout(timeout_s):
            plain = await _drafted(session, base_url, model, _PROMPTS[0], None)
            if plain == 0:
                return result("none", "a plain request drafted nothing")
            zero = await _drafted(session, base_url, model, _PROMPTS[1], 0)
    except TimeoutError:
        return result("ignored", f"probe failed: no answer within {timeout_s:g}s", True)
    except _ProbeFailed as exc:
        return result("ignored", f"probe failed: {exc}", True)
    if zero > 0:
        return result("ignored", f"drafted {zero} tokens with {DEPTH_KEY} 0 ({plain} without)")
    return result("per-request", f"drafted {plain} tokens without {DEPTH_KEY}, none with 0")


async def _drafted(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, depth: int | None
) -> int:
    """Tokens the backend drafted for one short greedy completion (0 when draft_n is absent)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": _MAX_TOKENS,
        "temperature": 0,
        "stream": False,
    }
    if depth is not None:
        body[DEPTH_KEY] = depth
    what = f"{_PATH}" + ("" if depth is None else f" with {DEPTH_KEY} {depth}")
    try:
        async with session.post(base_url.rstrip("/") + _PATH, json=body) as response:
            text = await response.text(errors="replace")
            status = response.status
    except (aiohttp.ClientError, OSError) as exc:
        raise _ProbeFailed(f"{what}: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise _ProbeFailed(f"{what} answered {status}: {text.strip()[:200]}")
    try:
        timings = json.loads(text)["timings"]
    except (ValueError, KeyError, TypeError):
        raise _ProbeFailed(f"{what}: the answer has no timings (not llama-server?)") from None
    drafted = timings.get("draft_n", 0) if isinstance(timings, dict) else None
    if not isinstance(drafted, int) or isinstance(drafted, bool) or drafted < 0:
        raise _ProbeFailed(f"{what}: timings.draft_n is {drafted!r}")
    return drafted

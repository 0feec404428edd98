"""A backend's numbers checked before anything is learned from them (pure).

Whatever answers on a backend's port (a remote ``url``, a buggy build, another program) writes
the numbers the router learns from: counts and durations in ``timings`` and ``usage``, and the
speeds the proxy derives from them. One impossible answer used to reach the learned cells: a
speed of ~1e196 tok/s (``predicted_ms`` = 1e-200) left a cell whose spread is NaN for good, and
a negative count made the whole learned file unreadable at the next start. So an observation is
learned only if its numbers could have come from a real run; otherwise it is dropped whole (the
reason says why) and what was learned before stays as it was.

The speed bounds are settings (``routing.max_decode_tok_s``, ``routing.max_prefill_tok_s``);
their defaults and why they are physical limits are in proxy/config/routing.py.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

from proxy.config.routing import RoutingSettings
from proxy.routing.telemetry import Observation, ParsedUsage

Implausible = Literal["negative", "non_finite", "too_large", "too_fast", "drafts"]
"""Why an observation was dropped: a count or duration below 0; a number that is NaN or
infinite; a token count past what llama.cpp can count; a decode or prefill speed above its
bound; more drafted tokens than the run could draft at its depth (or more accepted than
drafted)."""
IMPLAUSIBLE: tuple[Implausible, ...] = ("negative", "non_finite", "too_large", "too_fast", "drafts")
MAX_TOKENS = 2**31 - 1
"""llama.cpp counts tokens in 32-bit integers: no context, output or draft is larger. (A count
of 1e200 was finite, but its square in a cell's spread was not.)"""


def implausible(
    usage: ParsedUsage, observation: Observation, depth: int | None, settings: RoutingSettings
) -> Implausible | None:
    """Why ``observation`` (read from ``usage``) cannot be true, or None if it can. ``depth``:
    the draft depth the request ran at (per-request depths), None where it is not known."""
    numbers = _numbers(usage, observation)
    if not all(math.isfinite(x) for x in numbers):
        return "non_finite"
    if any(x < 0 for x in numbers) or (observation.prefill_tokens or 0) < 0:
        return "negative"
    if any(x > MAX_TOKENS for x in _counts(usage, observation)):
        return "too_large"
    if _too_fast(observation, settings):
        return "too_fast"
    if _too_many_drafts(observation, depth):
        return "drafts"
    return None


def dropped(observation: Observation, reason: Implausible) -> Observation:
    """The observation as the log line, the metrics and the live page may show it: none of the
    backend's numbers, the reason it was dropped."""
    return replace(
        observation,
        context_tokens=None,
        cached_tokens=None,
        output_tokens=None,
        draft_n=None,
        draft_n_accepted=None,
        decode_tok_s=None,
        prefill_s=None,
        ttft_s=None,
        dropped=reason,
    )


def _numbers(usage: ParsedUsage, observation: Observation) -> list[float]:
    fields = (
        usage.prompt_n,
        usage.cache_n,
        usage.predicted_n,
        usage.prompt_ms,
        usage.predicted_ms,
        usage.draft_n,
        usage.draft_n_accepted,
        usage.input_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        observation.context_tokens,
        observation.cached_tokens,
        observation.output_tokens,
        observation.draft_n,
        observation.draft_n_accepted,
        observation.decode_tok_s,
        observation.prefill_s,
        observation.ttft_s,
        observation.total_s,
    )
    return [float(x) for x in fields if x is not None]


def _counts(usage: ParsedUsage, observation: Observation) -> list[int]:
    fields = (
        usage.prompt_n,
        usage.cache_n,
        usage.predicted_n,
        usage.draft_n,
        usage.draft_n_accepted,
        usage.input_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        observation.context_tokens,
        observation.draft_n,
    )
    return [x for x in fields if x is not None]


def _too_fast(observation: Observation, settings: RoutingSettings) -> bool:
    """A decode or prefill speed above its bound. A non-stream answer without timings has no
    decode speed of its own yet (the statistics derive one): its output over its whole time is
    a lower bound of that speed, so above the bound it is impossible too."""
    decode, out, total = observation.decode_tok_s, observation.output_tokens, observation.total_s
    if decode is not None and decode > settings.max_decode_tok_s:
        return True
    if decode is None and out and total is not None and out > settings.max_decode_tok_s * total:
        return True
    tokens, seconds = observation.prefill_tokens, observation.prefill_s
    return bool(tokens and seconds is not None and tokens > settings.max_prefill_tok_s * seconds)


def _too_many_drafts(observation: Observation, depth: int | None) -> bool:
    """Each decode step drafts at most ``depth`` tokens and yields at least one, so a run of
    ``n`` output tokens drafted at most ``n * depth``; nothing accepts more than was drafted."""
    drafted, accepted = observation.draft_n, observation.draft_n_accepted
    if drafted is None:
        return False
    if accepted is not None and accepted > drafted:
        return True
    out = observation.output_tokens
    return depth is not None and out is not None and drafted > out * max(depth, 0)

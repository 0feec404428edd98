"""The steps both routing policies take to choose a profile (``policy`` for the pool, ``depth``
for one process), written once.

Pure, like the policies: data in, a value out; randomness only from the ``random.Random`` that
the caller's closures draw from. What differs between the policies (how a profile's time is
expected, which profiles are available, what counts as speculative) comes in as arguments.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Literal

from proxy.config.routing import Role, RoutingSettings
from proxy.routing.classes import RequestClass, bucket_labels, neighbours
from proxy.routing.features import ContentKind
from proxy.routing.stats import Estimate

Reason = Literal[
    "pinned",
    "affinity",
    "learned",
    "explore",
    "rule",
    "spill",
    "fallback",
    "busy",
    "collapsed",
    "client",
    "logprobs",
]
"""Why a request went where it did; "client": it set its own depth (``Router.client_depth``);
"logprobs": it asked for logprobs, so it runs at depth 0 (``logprobs``)."""

FALLBACK_ORDER: dict[Role, tuple[Role, ...]] = {
    "max": ("max", "min", "off"),
    "min": ("min", "off", "max"),
    "off": ("off", "min", "max"),
}
MIN_SD_FRACTION = 0.05  # Thompson draws: floor of the decode-speed spread, relative

ClassView = Callable[[RequestClass], Mapping[str, Estimate]]


def trusted_count(view: Mapping[str, Estimate], profiles: Collection[str]) -> int:
    return sum(1 for p, e in view.items() if e.trusted and p in profiles)


def borrowed_estimates(
    view_of: ClassView, cls: RequestClass, profiles: Collection[str], settings: RoutingSettings
) -> tuple[Mapping[str, Estimate], RequestClass]:
    """The class's estimates; while fewer than two of ``profiles`` are trusted there, those of
    the nearest class that has two (same bucket other kind, then the neighbouring buckets),
    with the class's own trusted ones on top. Also the class they come from.

    Profiles rank alike in neighbouring classes far more often than the cold rules guess right,
    so a class starts from its neighbours' ranking and then learns its own (its observations
    land in its own cells; exploration keeps trying the others).
    """
    own = view_of(cls)
    if trusted_count(own, profiles) >= 2:
        return own, cls
    for donor in neighbours(cls, settings):
        view = view_of(donor)
        if trusted_count(view, profiles) >= 2:
            return {**view, **{p: e for p, e in own.items() if e.trusted}}, donor
    return own, cls


TREND_WEIGHT_CAP = 5.0
"""A bucket's weight in the trend fit: its observation count, capped (a bucket seen a hundred
times must not make a line through one point)."""
TREND_MIN_SPAN = 4096.0
LOCAL_POINTS = 4
"""Recent requests a local line needs (``trend_estimates``)."""
"""The trend needs buckets at least this many tokens of context apart (else it has no slope)."""


def trend_estimates(
    view_of: ClassView,
    cls: RequestClass,
    profiles: Collection[str],
    settings: RoutingSettings,
    tokens: int,
    extra: Mapping[str, tuple[float, float]] | None = None,
    recent: Mapping[str, list[tuple[float, float]]] | None = None,
) -> dict[str, Estimate]:
    """Per profile, the decode speed its cells of the same content kind in the context buckets
    point to at ``tokens`` of context: a line through (mean context, seconds per token),
    weighted by each cell's observations (``TREND_WEIGHT_CAP``), never falling with context.
    Time per token, not speed: a step's cost grows linearly with the context (verification
    attends over all of it) while the accepted tokens per step fall slowly, so time per token is
    close to linear.
    Each a copy of that profile's nearest cell with the predicted speed; empty unless two
    profiles have one (a ranking needs two). ``extra``: per profile one more point (context,
    tok/s) of weight 1: what the backend's start-up calibration measured alone on a short prompt
    of this kind. ``recent``: per profile the last requests' (context, tok/s): where at least
    ``LOCAL_POINTS`` of them span ``TREND_MIN_SPAN`` tokens, the line is theirs alone, each of
    weight 1 (a session growing turn by turn extrapolates a few thousand tokens, not from the
    middle of its buckets).

    Why: drafting's advantage falls with context in every published measurement (verification
    attends over the whole context while acceptance falls: published-figures.md, "Long context
    and content"), so the ranking a longer bucket needs is the trend of the shorter ones, not
    their level: a session growing past 64k tokens reaches the crossover where no shorter
    bucket has it. The measurements behind the line: docs/routing.md, "Context trend"."""
    points, nearest = _bucket_points(view_of, cls, profiles, tokens, settings)
    for profile, (context, tok_s) in (extra or {}).items():
        if profile in profiles and tok_s > 0:
            points.setdefault(profile, []).append((context, 1.0 / tok_s, 1.0))
    for profile, last in (recent or {}).items():
        local = [(x, 1.0 / v, 1.0) for x, v in last if v > 0]
        xs = [x for x, _, _ in local]
        if len(local) >= LOCAL_POINTS and max(xs) - min(xs) >= TREND_MIN_SPAN:
            points[profile] = local
    out: dict[str, Estimate] = {}
    for profile, pts in points.items():
        line = rising_line(pts) if profile in nearest else None  # a calibration point alone
        seconds = line[0] + line[1] * tokens if line is not None else 0.0
        if seconds > 0:
            out[profile] = replace(nearest[profile][1], decode_tok_s=1.0 / seconds, trusted=True)
    return out if len(out) >= 2 else {}


Points = dict[str, list[tuple[float, float, float]]]


def _bucket_points(
    view_of: ClassView,
    cls: RequestClass,
    profiles: Collection[str],
    tokens: int,
    settings: RoutingSettings,
) -> tuple[Points, dict[str, tuple[float, Estimate]]]:
    """Per profile, each bucket's (mean context, seconds per token, weight) of a content kind,
    and the profile's cell nearest to ``tokens`` (what a prediction copies the rest from)."""
    points: Points = {}
    nearest: dict[str, tuple[float, Estimate]] = {}
    for label in bucket_labels(settings.context_buckets):
        for profile, e in view_of(RequestClass(label, cls.kind)).items():
            if profile not in profiles or not e.decode_tok_s or e.context_tokens is None:
                continue
            if e.count < 1:
                continue
            weight = min(float(e.count), TREND_WEIGHT_CAP)
            points.setdefault(profile, []).append((e.context_tokens, 1.0 / e.decode_tok_s, weight))
            distance = abs(e.context_tokens - tokens)
            if profile not in nearest or distance < nearest[profile][0]:
                nearest[profile] = (distance, e)
    return points, nearest


def rising_line(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Weighted least squares y = a + b x with b >= 0; None without two points far enough
    apart."""
    if len(points) < 2:
        return None
    w = sx = sy = sxx = sxy = 0.0
    low = high = points[0][0]
    for x, y, wt in points:  # one pass: this runs for every depth of every free choice
        w, sx, sy = w + wt, sx + wt * x, sy + wt * y
        sxx, sxy = sxx + wt * x * x, sxy + wt * x * y
        low, high = min(low, x), max(high, x)
    if high - low < TREND_MIN_SPAN:
        return None
    mx, my = sx / w, sy / w
    var, cov = sxx - w * mx * mx, sxy - w * mx * my
    slope = max(cov / var, 0.0) if var > 0 else 0.0
    return my - slope * mx, slope


def expected_output_tokens(
    estimates: Mapping[str, Estimate], max_tokens: int | None, settings: RoutingSettings
) -> float:
    """The longest learned answer of the trusted estimates (else the prior), capped by the
    request's own limit."""
    learned = [e.output_tokens for e in estimates.values() if e.trusted and e.output_tokens]
    out = max(learned) if learned else float(settings.prior_output_tokens)
    if max_tokens is not None:
        # min() before float(): a client's huge integer must not overflow the float.
        out = float(min(out, max_tokens))
    return max(out, 1.0)


def service_s(
    estimate: Estimate, prompt_tokens: int, out: float, decode_tok_s: float, s: RoutingSettings
) -> float:
    """Seconds to prefill the prompt at the learned (else prior) rate and decode ``out``."""
    prefill = estimate.prefill_tok_s or s.prior_prefill_tok_s
    return prompt_tokens / prefill + out / decode_tok_s


def below_break_even(estimate: Estimate | None, settings: RoutingSettings) -> bool:
    """Whether a drafting profile's learned (trusted) acceptance is below break-even."""
    if estimate is None:
        return False
    acc = estimate.acceptance_trusted(settings.min_samples)
    return acc is not None and acc < settings.break_even_acceptance


def cold_role(prompt_tokens: int, kind: ContentKind, settings: RoutingSettings) -> Role:
    """The cold rule for a request decoding alone: short -> max, long code -> min, long prose
    -> off (as configured)."""
    if prompt_tokens >= settings.long_context_tokens:
        return settings.cold_long_code_role if kind == "code" else settings.cold_long_prose_role
    return settings.cold_short_role


def role_pick(
    role: Role,
    settings: RoutingSettings,
    available: Collection[str],
    guarded: Callable[[str], bool],
    *,
    missing_means_fallback: bool,
) -> tuple[str, Reason, str] | None:
    """The first profile in the role's fallback order that is available and not below
    break-even: (profile, reason, why it is not the first); None when none is.

    ``missing_means_fallback``: an unavailable role profile is noted ("not ready") and the pick
    counts as a fallback (the pool: its backends come and go); else it is passed over silently
    (one process: the model simply has no such depth)."""
    skipped: list[str] = []
    unavailable = False
    for r in FALLBACK_ORDER[role]:
        profile = settings.role_profile(r)
        if profile not in available:
            if missing_means_fallback:
                skipped.append(f"{profile} not ready")
                unavailable = True
        elif guarded(profile):
            skipped.append(f"{profile} below break-even")
        else:
            why = f" ({'; '.join(skipped)})" if skipped else ""
            return profile, "fallback" if unavailable else "rule", why
    return None


def learned_detail(
    label: str, trusted: Mapping[str, Estimate], source: RequestClass, cls: RequestClass
) -> str:
    """The decision's detail for a learned choice: each trusted profile's decode speed."""
    speeds = ", ".join(f"{p} {trusted[p].decode_tok_s or 0:.1f}" for p in sorted(trusted))
    borrowed = f" (from {source.label})" if source != cls else ""
    return f"learned {label}{borrowed}: {speeds} tok/s"


def explores(
    reason: Reason,
    prompt_tokens: int,
    settings: RoutingSettings,
    rng: random.Random,
    *,
    cold: bool = False,
    max_tokens: int | None = None,
) -> bool:
    """Whether this free choice explores: a choice still made by the cold rules (or ``cold``:
    by a neighbour's ranking, or on one process while a depth that could win is not known) at
    ``cold_exploration_rate`` (bounded: only until two profiles are trusted there, and that
    depth), a learned one at the small steady ``exploration_rate``; never past
    ``max_tokens`` (default ``exploration_max_tokens``)."""
    cold = cold or reason == "rule"
    rate = settings.cold_exploration_rate if cold else settings.exploration_rate
    limit = settings.exploration_max_tokens if max_tokens is None else max_tokens
    return settings.learning and prompt_tokens < limit and rng.random() < rate


def thompson_speed(mean: float, spread: float, samples: float, rng: random.Random) -> float:
    """One Thompson draw of a decode speed: the mean's uncertainty shrinks with the samples."""
    sd = max(spread, MIN_SD_FRACTION * mean) / max(samples, 1.0) ** 0.5
    return max(rng.gauss(mean, sd), 0.05 * mean)


def exploration_target(
    chosen: str,
    profiles: Iterable[str],
    estimates: Mapping[str, Estimate],
    trusted: Mapping[str, Estimate],
    *,
    long_context: bool,
    guarded: Callable[[str], bool],
    expected_s: Callable[[str], float],
    drawn_s: Callable[[str], float],
    max_regret: float,
) -> str | None:
    """Another profile to try instead of ``chosen``, or None (Thompson sampling kept it).

    Untried profiles first (the least observed); then one Thompson draw of each profile's time
    (``drawn_s``), the fastest draw winning. On long contexts never a profile below break-even
    (``guarded``) or known to lose more than ``max_regret`` against the choice."""
    best = expected_s(chosen) if chosen in trusted else None
    eligible: list[str] = []
    for p in sorted(profiles):
        if p == chosen or (long_context and guarded(p)):
            continue
        # goodput ratio = time ratio; skip profiles known to lose more than max_regret
        worse = best is not None and p in trusted and best / expected_s(p) < 1.0 - max_regret
        if not (long_context and worse):
            eligible.append(p)
    if not eligible:
        return None
    untried = [p for p in eligible if p not in trusted]
    if untried:
        return min(untried, key=lambda p: (estimates[p].count if p in estimates else 0, p))
    if chosen not in trusted:
        return None
    draws = {p: drawn_s(p) for p in [chosen, *eligible]}
    pick = min(draws, key=lambda p: (draws[p], p))
    return None if pick == chosen else pick

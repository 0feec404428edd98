"""The routing policy of one process: which replica, and which per-request draft depth.

Pure, like ``policy``: data in, a decision out; randomness only from the ``random.Random``
passed in. Every depth shares the process's prefix cache, so a session's replica is the one
holding its cache, and its depth is chosen afresh for each request, in order:

1. replica: the one holding the session's cache if it has room, else the least loaded.
2. pin: ``X-MTP-Profile`` names a profile: its depth, whatever else decodes.
   collapsed: the replica's drafts stopped being accepted (``proxy.routing.collapse``): depth 0,
   but for a drafting trial at the deepest depth once its back-off is over.
3. busy (unless the model allows mixed depths): a request that will decode beside others gets
   the depth of the process's current busy epoch (``busy``: one depth for the process while it
   is busy, learned from what it achieved at each depth there).
4. learned: with two or more trusted depths for (class, load level), the best expected goodput
   (output tokens / (prefill + decode time)) measured at that level; a class short of data
   borrows the ranking of its neighbours at the same level.
5. rule: cold start. Alone: short -> max, long code -> min, long prose -> off; beside others
   (a model whose slots may mix depths): ``cold_busy_role`` (off). A replica's start-up
   calibration replaces both where it measured (``Replica.cold_roles``: beside others the
   faster depth at that load; alone off if drafting lost even there). A depth whose learned
   acceptance is below break-even is skipped.
6. explore: at most ``exploration_rate`` (``cold_exploration_rate`` while cold: placed by the
   rules or by a neighbour's ranking) of the free choices try another depth, untried in the
   class first, then Thompson sampling; at any prompt length (every depth shares the cache),
   but on long contexts never a depth known to lose much.

The load level of a request is what will decode beside it: the requests in flight on the
replica plus itself, or the replica's recent concurrency if higher (so the first request of a
burst is counted busy too). The statistics learn only from requests that decoded at one depth
throughout (the router's caller drops the others; the busy epochs weigh every request by its time
at one depth instead: routing.busy). Why: docs/routing.md ("Decision on one process").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.config.routing import RoutingSettings
from proxy.routing import choice
from proxy.routing.calibration import Calibration
from proxy.routing.choice import Reason
from proxy.routing.classes import RequestClass, bucket_labels, classify_tokens, load_level
from proxy.routing.features import RequestFeatures
from proxy.routing.stats import Estimate


@dataclass(frozen=True, slots=True)
class Replica:
    """One process of a model served with per-request depths, as the policy sees it."""

    name: str
    ready: bool
    in_flight: int
    slots: int
    holds_session: bool = False
    recent_load: float = 1.0
    """Decayed mean of the requests decoding at its recent admissions (each counting itself)."""
    busy_depth: str | None = None
    """The depth of its current busy epoch (``busy``): what requests beside others run at."""
    calibration: Calibration | None = None
    """Its start-up calibration (``proxy.routing.calibration``): its cold rule at a load level
    and context replaces the configured one where it says something."""
    alone_points: Mapping[str, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    """Per content kind, per profile: (context, tok/s) its calibration measured alone on a short
    prompt (the first point of the kind's context trend, at load level 1)."""
    collapsed: bool = False
    """Its drafts' acceptance collapsed (``proxy.routing.collapse``): it serves depth 0 ..."""
    trial: bool = False
    """... except for a drafting trial, once its back-off is over."""

    @property
    def has_room(self) -> bool:
        return self.in_flight < self.slots


@dataclass(frozen=True, slots=True)
class DepthDecision:
    backend: str
    profile: str
    depth: int
    reason: Reason
    detail: str
    level: int
    """The load level the depth was chosen for (the statistics' key)."""


class LevelStatsView(Protocol):
    """What the policy reads from the learned statistics, per load level."""

    def view_at(self, cls: RequestClass, level: int) -> Mapping[str, Estimate]: ...

    def recent_at(self, kind: str, level: int) -> Mapping[str, list[tuple[float, float]]]: ...


def decide_depth(
    features: RequestFeatures,
    replicas: Sequence[Replica],
    depths: Mapping[str, int],
    stats: LevelStatsView,
    settings: RoutingSettings,
    rng: random.Random,
    *,
    mixed: bool = False,
) -> DepthDecision | None:
    """Pick a replica and a depth for one request; None when no replica is ready."""
    ready = [r for r in replicas if r.ready]
    if not ready:
        return None
    replica = min(ready, key=_replica_order)
    level = load_level(max(replica.in_flight + 1, replica.recent_load), settings)

    def decision(profile: str, reason: Reason, detail: str) -> DepthDecision:
        return DepthDecision(replica.name, profile, depths[profile], reason, detail, level)

    note = ""
    if features.pinned_profile:
        pinned = settings.resolve_pin(features.pinned_profile)
        if pinned in depths:
            return decision(pinned, "pinned", f"pin {features.pinned_profile}")
        note = f"pin {features.pinned_profile} unknown; "
    if replica.collapsed:
        shallowest = min(depths, key=lambda p: (depths[p], p))
        if replica.trial:
            deepest = max(depths, key=lambda p: (depths[p], p))
            detail = f"{note}drafting trial on {replica.name} after an acceptance collapse"
            return decision(deepest, "collapsed", detail)
        detail = f"{note}acceptance collapsed on {replica.name}: depth {depths[shallowest]}"
        return decision(shallowest, "collapsed", detail)
    busy = replica.busy_depth
    if level > 1 and not mixed and busy is not None and busy in depths:
        return decision(busy, "busy", f"{note}busy epoch of {replica.name} at {busy}")
    cls = classify_tokens(features.est_prompt_tokens, features.kind, settings)
    chooser = _Choice(features, depths, stats, settings, cls, level, replica)
    profile, reason, detail = chooser.place()
    # Every depth shares the process's prefix cache: a long prompt explored at another depth
    # costs that request's decode only, not later turns' re-prefill as on a pool, so there is
    # no exploration_max_tokens here (long contexts still never explore a depth known to lose
    # much). A class placed by its neighbours' ranking is still cold: it explores at the cold
    # rate until it has its own two trusted depths, and every depth that could win is known.
    prompt = features.est_prompt_tokens
    if choice.explores(reason, prompt, settings, rng, cold=chooser.cold, max_tokens=_NO_LIMIT):
        explored = chooser.explore(profile, rng)
        if explored is not None:
            profile, reason, detail = explored, "explore", f"explore {explored} (was {profile})"
    return decision(profile, reason, f"{note}{detail}")


_NO_LIMIT = 1 << 62


def _beyond_reach(
    unknown: list[str],
    known: Mapping[str, Estimate],
    view_of: Callable[[RequestClass], Mapping[str, Estimate]],
    cls: RequestClass,
    settings: RoutingSettings,
    tokens: int,
    extra: Mapping[str, tuple[float, float]] | None,
) -> set[str]:
    """The unknown depths whose best speed so far, measured at a shorter context (speed never
    rises with context), is below the best known depth's prediction at ``tokens``."""
    best = max((e.decode_tok_s or 0.0 for e in known.values()), default=0.0)
    if best <= 0:
        return set()
    bound: dict[str, float] = {}
    for p, (context, speed) in (extra or {}).items():
        if context <= tokens:
            bound[p] = max(bound.get(p, 0.0), speed)
    for label in bucket_labels(settings.context_buckets):
        for p, e in view_of(RequestClass(label, cls.kind)).items():
            if e.decode_tok_s and e.context_tokens is not None and e.context_tokens <= tokens:
                bound[p] = max(bound.get(p, 0.0), e.decode_tok_s)
    return {p for p in unknown if p in bound and bound[p] < best}


def _replica_order(r: Replica) -> tuple[bool, bool, float, str]:
    # The session's cache holder while it has room; else the least loaded.
    return (not (r.holds_session and r.has_room), not r.has_room, r.in_flight / r.slots, r.name)


class _Choice:
    """One free depth choice: the estimates of its class and level, and the rules."""

    def __init__(
        self,
        features: RequestFeatures,
        depths: Mapping[str, int],
        stats: LevelStatsView,
        settings: RoutingSettings,
        cls: RequestClass,
        level: int,
        replica: Replica,
    ) -> None:
        self.f, self.depths, self.s, self.cls, self.level = features, depths, settings, cls, level
        self.calibration = replica.calibration

        views: dict[RequestClass, Mapping[str, Estimate]] = {}

        def view_of(c: RequestClass) -> Mapping[str, Estimate]:
            view = views.get(c)
            if view is None:  # read once per decision: the trend reads every bucket twice
                view = views[c] = {p: e for p, e in stats.view_at(c, level).items() if p in depths}
            return view

        own = {p: e for p, e in view_of(cls).items() if e.trusted}
        extra = replica.alone_points.get(cls.kind) if level == 1 else None
        tokens = features.est_prompt_tokens
        recent = stats.recent_at(cls.kind, level)
        trend = choice.trend_estimates(view_of, cls, depths, settings, tokens, extra, recent)
        self.trended = bool(trend)
        """The class is placed by the context trend of its kind (``choice.trend_estimates``):
        a prediction at this request's own context, where the class's cells average its whole
        bucket (64k+ spans 64k to the context's end); its own cells fill the depths the trend
        lacks."""
        self.est: Mapping[str, Estimate]
        if trend:
            self.est, self.source = {**own, **trend}, cls
        elif len(own) >= 2:
            self.est, self.source = view_of(cls), cls
        else:
            self.est, self.source = choice.borrowed_estimates(view_of, cls, depths, settings)
        self.own = own
        # What exploration counts as known: the trend's estimates (a prediction at this very
        # context), or only the class's own (a neighbour's level is a prior, not a measurement).
        self.known = self.trusted() if trend else own
        self._reach(view_of, extra)
        self.out = choice.expected_output_tokens(self.est, features.max_tokens, settings)
        rates = [e.prefill_tok_s for e in self.est.values() if e.prefill_tok_s]
        self.prefill_tok_s = sum(rates) / len(rates) if rates else None

    def _reach(
        self,
        view_of: Callable[[RequestClass], Mapping[str, Estimate]],
        extra: Mapping[str, tuple[float, float]] | None,
    ) -> None:
        """Which unknown depths cannot win here (``beyond_reach``), and whether the class is
        still cold (``cold``)."""
        unknown = [p for p in self.depths if p not in self.known]
        tokens = self.f.est_prompt_tokens
        self.beyond_reach = _beyond_reach(
            unknown, self.known, view_of, self.cls, self.s, tokens, extra
        )
        """Depths without an estimate that cannot win here: never faster than where they were
        measured at a shorter context (the alone calibration, a shorter bucket), and that is
        below the best known prediction at this context. Not explored here (docs/routing.md,
        "Exploration")."""
        wanted = [p for p in unknown if p not in self.beyond_reach]
        self.cold = self.source != self.cls or bool(wanted)
        """Explore at the cold rate: placed by a neighbour's level, or while a depth that could
        win here is not known (no line, fewer than ``min_samples`` of the class's own): it
        cannot be ranked, whether the class is placed by the context trend or by its own two
        trusted depths (docs/routing.md, "Exploration"). Bounded: a depth measured below the
        best known one is beyond reach, not wanted."""

    def trusted(self) -> dict[str, Estimate]:
        return {p: e for p, e in self.est.items() if e.trusted}

    def expected_s(self, profile: str, decode: float | None = None) -> float:
        """Prefill at the class's common rate, then decode at the profile's speed: every
        depth's prompt is processed alike by the one process, so a per-depth prefill estimate
        (each from other requests, other cache hits) would only add noise to the ranking."""
        e = self.est[profile]
        speed = decode if decode is not None else (e.decode_tok_s or self.s.prior_decode_tok_s)
        prefill = self.prefill_tok_s or self.s.prior_prefill_tok_s
        return self.f.est_prompt_tokens / prefill + self.out / speed

    def guarded(self, profile: str) -> bool:
        """A drafting depth whose learned acceptance is below break-even."""
        drafting = self.depths.get(profile, 0) != 0
        return drafting and choice.below_break_even(self.est.get(profile), self.s)

    def place(self) -> tuple[str, Reason, str]:
        trusted = self.trusted()
        at = f"{self.cls.label}@{self.level}"
        if len(trusted) < 2:
            return self._rule(at)
        best = min(trusted, key=lambda p: (self.expected_s(p), p))
        detail = choice.learned_detail(at, trusted, self.source, self.cls)
        return best, "learned", detail + (" (context trend)" if self.trended else "")

    def _rule(self, at: str) -> tuple[str, Reason, str]:
        s = self.s
        calibration = self.calibration
        tokens = self.f.est_prompt_tokens
        kinds: dict[str, float] = {self.f.kind: 1.0}
        calibrated = calibration.cold_role(self.level, tokens, kinds) if calibration else None
        if calibrated is not None:  # what the replica measured at this load at start-up
            role = calibrated
        elif self.level > 1:  # beside others
            role = s.cold_busy_role
        else:
            role = choice.cold_role(self.f.est_prompt_tokens, self.f.kind, s)
        picked = choice.role_pick(role, s, self.depths, self.guarded, missing_means_fallback=False)
        if picked is not None:
            profile, reason, why = picked
            return profile, reason, f"rule {at} -> {role}{why}"
        shallowest = min(self.depths, key=lambda p: (self.depths[p], p))
        return shallowest, "fallback", f"fallback {at}: no role profile usable"

    def explore(self, chosen: str, rng: random.Random) -> str | None:
        """An exploration target, or None (Thompson sampling kept the choice). Untried: without
        an estimate of this class's own or of its context trend."""
        return choice.exploration_target(
            chosen,
            [p for p in self.depths if p not in self.beyond_reach],
            self.est,
            self.known,
            long_context=self.f.est_prompt_tokens >= self.s.long_context_tokens,
            guarded=self.guarded,
            expected_s=self.expected_s,
            drawn_s=lambda p: self._thompson(p, rng),
            max_regret=self.s.exploration_max_regret,
        )

    def _thompson(self, profile: str, rng: random.Random) -> float:
        e = self.est[profile]
        mean = e.decode_tok_s or self.s.prior_decode_tok_s
        return self.expected_s(profile, choice.thompson_speed(mean, e.decode_sd, e.samples, rng))

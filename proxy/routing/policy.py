"""The routing policy: features + backend states + learned statistics in, a decision out.

Pure: no I/O, no clock, randomness only from the ``random.Random`` passed in. Order of rules:

1. pin: ``X-MTP-Profile: off|min|max|<name>`` wins if a ready backend of that profile exists.
2. affinity: a session stays on the backend holding its prefix cache unless the expected gain
   elsewhere, counted over ``affinity_horizon_requests``, outweighs re-processing the prompt
   (or, when the holder is busy, queueing there costs more than re-processing elsewhere).
3. placement: with trusted estimates for two or more profiles of the (planned) class, the best
   expected goodput = output tokens / (prefill + queue + decode time), load included; otherwise
   the cold rules (short -> max, long code -> min, long prose -> off) with the break-even
   acceptance guard. Agent-like new sessions are planned at ``agent_horizon_tokens``, with the
   long sessions resident on each backend counted as load (cold: spread over min and off).
4. exploration: at most ``exploration_rate`` of placements, Thompson sampling among the other
   profiles (untried first), ``cold_exploration_rate`` while the class is still placed by the
   cold rules; never for a session with a cache holder, never past
   ``exploration_max_tokens``, and on long contexts never a profile known to be much worse.
5. spill: a busy chosen backend (in_flight >= spill_threshold x slots) gives way to another
   profile's free backend when that is expected to finish sooner.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.config.routing import Role, RoutingSettings
from proxy.routing import choice
from proxy.routing.choice import Reason
from proxy.routing.classes import RequestClass, classify_tokens
from proxy.routing.features import RequestFeatures
from proxy.routing.stats import Estimate


@dataclass(frozen=True, slots=True)
class Candidate:
    """One backend as the policy sees it (a snapshot the app builds per request)."""

    name: str
    profile: str
    ready: bool
    in_flight: int
    slots: int
    holds_session: bool = False
    evicts_tokens: int = 0
    """Prompt tokens of another session's cache that a new session here would overwrite (the
    backend's least recently used idle slot, when every slot holds one); 0 if a slot is free."""
    resident: int = 0
    """Other long sessions (agents, documents) whose caches this backend holds: standing load."""


@dataclass(frozen=True, slots=True)
class Decision:
    backend: str
    profile: str
    reason: Reason
    detail: str


class StatsView(Protocol):
    """What the policy reads from the learned statistics (LearnedStats implements it)."""

    def view(self, cls: RequestClass) -> Mapping[str, Estimate]: ...


@dataclass(frozen=True, slots=True)
class _Cost:
    """Expected seconds of one request on one backend, by component."""

    wait: float
    prefill: float
    decode: float
    evict: float = 0.0  # expected re-processing another session pays for the slot we take

    @property
    def total(self) -> float:
        return self.wait + self.prefill + self.decode + self.evict


class _Planner:
    """Per-decision helpers over the ready candidates; lives for one decide() call."""

    def __init__(
        self,
        features: RequestFeatures,
        ready: Sequence[Candidate],
        estimates: Mapping[str, Estimate],
        source: RequestClass,
        settings: RoutingSettings,
    ) -> None:
        self.f = features
        self.s = settings
        self.est = estimates
        self.source = source  # the class the estimates come from (see _estimates)
        self.groups: dict[str, list[Candidate]] = {}
        for c in ready:
            self.groups.setdefault(c.profile, []).append(c)
        self.out = choice.expected_output_tokens(estimates, features.max_tokens, settings)
        self._best: dict[str, Candidate | None] = {}
        # A new agent session stays where it starts for its cache: the long sessions already
        # resident on a backend load it for the session's whole life, not just their in-flight
        # requests of the moment.
        self.long_lived = features.agentic and not any(c.holds_session for c in ready)

    def trusted(self) -> dict[str, Estimate]:
        return {p: e for p, e in self.est.items() if e.trusted and p in self.groups}

    def busy(self, c: Candidate) -> bool:
        return c.in_flight >= self.s.spill_threshold * max(c.slots, 1)

    def best_backend(self, profile: str, *, exclude: str | None = None) -> Candidate | None:
        """Least loaded backend of a profile (a session holder first)."""
        if exclude is None and profile in self._best:
            return self._best[profile]
        group = [c for c in self.groups.get(profile, ()) if c.name != exclude]
        best = min(group, key=_backend_order) if group else None
        if exclude is None:
            self._best[profile] = best
        return best

    def cost(self, c: Candidate) -> _Cost:
        """Expected time of this request on ``c``: queue + prefill of uncached tokens + decode."""
        e = self.est.get(c.profile)
        prefill_rate = (e.prefill_tok_s if e else None) or self.s.prior_prefill_tok_s
        n = c.in_flight
        load = max(n, c.resident) if self.long_lived else n
        decode = self.idle_decode(c.profile) / self.load_factor(c.profile, load)
        uncached = 0 if c.holds_session else self.f.est_prompt_tokens
        service = uncached / prefill_rate + self.out / decode
        slots = max(c.slots, 1)
        wait = max(0, n - slots + 1) * service / slots
        evict = 0.0 if c.holds_session else c.evicts_tokens / prefill_rate * self.s.eviction_weight
        return _Cost(wait, uncached / prefill_rate, self.out / decode, evict)

    def load_factor(self, profile: str, n: float) -> float:
        """How much slower one request decodes with ``n`` others on the backend (prior shape:
        continuous batching shares the GPU; speculation's verification batch grows too)."""
        f = 1.0 + self.s.batch_slowdown * n
        if self.s.is_speculative(profile):
            f *= 1.0 + self.s.spec_load_penalty * n  # the speculation gain shrinks
        return f

    def idle_decode(self, profile: str) -> float:
        """Decode tok/s of a profile alone on its backend. A learned speed was measured at
        the cell's mean load: scaled back from it, so load is not counted twice."""
        e = self.est.get(profile)
        if e is None or e.decode_tok_s is None:
            return self.s.prior_decode_tok_s
        return e.decode_tok_s * self.load_factor(profile, e.decode_load)

    def acceptance_guarded(self, profile: str) -> bool:
        """True if the learned acceptance of a speculative profile is below break-even."""
        drafting = self.s.is_speculative(profile)
        return drafting and choice.below_break_even(self.est.get(profile), self.s)


def _load(c: Candidate) -> float:
    return c.in_flight / max(c.slots, 1)


def _backend_order(c: Candidate) -> tuple[bool, float, int, int, str]:
    return (not c.holds_session, _load(c), c.evicts_tokens, c.in_flight, c.name)


def _decision(c: Candidate, reason: Reason, detail: str) -> Decision:
    return Decision(backend=c.name, profile=c.profile, reason=reason, detail=detail)


def decide(
    features: RequestFeatures,
    candidates: Sequence[Candidate],
    stats: StatsView,
    settings: RoutingSettings,
    rng: random.Random,
) -> Decision | None:
    """Pick a backend for one request; None when no candidate is ready (the app answers 503)."""
    ready = [c for c in candidates if c.ready]
    if not ready:
        return None
    note = ""
    if features.pinned_profile:
        target = settings.resolve_pin(features.pinned_profile)
        group = [c for c in ready if c.profile == target]
        if group:
            pick = min(group, key=_backend_order)
            return _decision(pick, "pinned", f"pin {features.pinned_profile}")
        note = f"pin {features.pinned_profile} unavailable; "
    tokens = features.est_prompt_tokens
    holders = [c for c in ready if c.holds_session]
    if holders:
        cls = classify_tokens(tokens, features.kind, settings)
        plan = _Planner(features, ready, *_estimates(stats, cls, ready, settings), settings)
        return _affinity(plan, min(holders, key=lambda c: (_load(c), c.name)), note)
    if features.agentic and settings.agent_horizon_tokens:
        tokens = max(tokens, settings.agent_horizon_tokens)
    cls = classify_tokens(tokens, features.kind, settings)
    plan = _Planner(features, ready, *_estimates(stats, cls, ready, settings), settings)
    profile, reason, detail = _place(plan, tokens, cls)
    if choice.explores(reason, tokens, settings, rng):
        explored = _explore(plan, profile, tokens, rng)
        if explored is not None:
            profile, reason, detail = explored, "explore", f"explore {explored} (was {profile})"
    if reason in ("rule", "fallback"):
        profile, detail = _spread(plan, profile, detail)
        profile, reason, detail = _spare_cache(plan, profile, reason, detail)
    return _spill(plan, profile, reason, note + detail)


_LONG_CODE_ROLES: tuple[Role, ...] = ("min", "off")  # the design card's long-code picks


def _spread(plan: _Planner, profile: str, detail: str) -> tuple[str, str]:
    """A cold placement of a new agent session goes to the other long-code profile when its
    backend carries fewer long sessions: two agents decoding long contexts on one backend
    cost each other most of the speculation gain, and neither will move (its cache)."""
    names = [plan.s.role_profile(r) for r in _LONG_CODE_ROLES]
    if not plan.long_lived or profile not in names:
        return profile, detail
    chosen = plan.best_backend(profile)
    assert chosen is not None  # profile comes from plan.groups
    load = max(chosen.in_flight, chosen.resident)
    for p in names:
        c = plan.best_backend(p)
        if p == profile or c is None or plan.acceptance_guarded(p) or plan.busy(c):
            continue
        if max(c.in_flight, c.resident) < load:
            return p, f"{detail}; spread: {chosen.resident} long sessions on {chosen.name}"
    return profile, detail


def _spare_cache(
    plan: _Planner, profile: str, reason: Reason, detail: str
) -> tuple[str, Reason, str]:
    """Cold placement that would overwrite a long cached prompt (an agent's, a document's)
    goes to another profile whose backend overwrites less, when that re-processing would cost
    more than this whole request. The learned path weighs the same cost in _Planner.cost."""
    chosen = plan.best_backend(profile)
    assert chosen is not None  # profile comes from plan.groups
    cost = plan.cost(chosen)
    if cost.evict <= cost.prefill + cost.decode:
        return profile, reason, detail
    spare = [
        c
        for p in sorted(plan.groups)
        if p != profile and (c := plan.best_backend(p)) is not None and not plan.busy(c)
    ]
    target = min(spare, key=lambda c: (plan.cost(c).total, c.name), default=None)
    if target is None or plan.cost(target).total >= cost.total:
        return profile, reason, detail
    why = f"spare {chosen.evicts_tokens} cached tokens on {chosen.name}"
    return target.profile, "spill", f"{why}; {detail}"


def _estimates(
    stats: StatsView, cls: RequestClass, ready: Sequence[Candidate], settings: RoutingSettings
) -> tuple[Mapping[str, Estimate], RequestClass]:
    """The class's estimates, borrowed from a neighbour while fewer than two ready profiles
    are trusted there (``choice.borrowed_estimates``)."""
    return choice.borrowed_estimates(stats.view, cls, {c.profile for c in ready}, settings)


def _place(plan: _Planner, tokens: int, cls: RequestClass) -> tuple[str, Reason, str]:
    """Choose a profile for a request no backend holds a cache for."""
    trusted = plan.trusted()
    if len(trusted) < 2:
        return _rule(plan, tokens, cls)
    loaded: dict[str, float] = {}
    for p in trusted:
        c = plan.best_backend(p)
        if c is not None:
            loaded[p] = plan.cost(c).total
    best = min(loaded, key=lambda p: (loaded[p], p))
    idle_best = min(loaded, key=lambda p: (_unloaded(plan, p), p))
    detail = choice.learned_detail(cls.label, trusted, plan.source, cls)
    if best != idle_best:
        busy_backend = plan.best_backend(idle_best)
        if busy_backend is not None and plan.busy(busy_backend):
            return best, "spill", f"spill {idle_best} busy ({busy_backend.name}); {detail}"
        detail += f"; load favours {best} over {idle_best}"
    return best, "learned", detail


def _unloaded(plan: _Planner, profile: str) -> float:
    e, tokens = plan.est[profile], plan.f.est_prompt_tokens
    return choice.service_s(e, tokens, plan.out, plan.idle_decode(profile), plan.s)


def _rule(plan: _Planner, tokens: int, cls: RequestClass) -> tuple[str, Reason, str]:
    role = choice.cold_role(tokens, plan.f.kind, plan.s)
    picked = choice.role_pick(
        role, plan.s, plan.groups, plan.acceptance_guarded, missing_means_fallback=True
    )
    if picked is not None:
        profile, reason, why = picked
        return profile, reason, f"rule {cls.label} -> {role}{why}"
    # None of the role profiles is usable: any ready profile, least loaded first.
    any_pick = min(
        (c for group in plan.groups.values() for c in group),
        key=lambda c: (_load(c), c.name),
    )
    return any_pick.profile, "fallback", f"fallback {cls.label}: no role profile usable"


def _explore(plan: _Planner, chosen: str, tokens: int, rng: random.Random) -> str | None:
    """An exploration target, or None (Thompson sampling kept the choice)."""
    return choice.exploration_target(
        chosen,
        plan.groups,
        plan.est,
        plan.trusted(),
        long_context=tokens >= plan.s.long_context_tokens,
        guarded=plan.acceptance_guarded,
        expected_s=lambda p: _unloaded(plan, p),
        drawn_s=lambda p: _thompson_time(plan, p, rng),
        max_regret=plan.s.exploration_max_regret,
    )


def _thompson_time(plan: _Planner, profile: str, rng: random.Random) -> float:
    e = plan.est[profile]
    mean = plan.idle_decode(profile)
    spread = e.decode_sd * mean / e.decode_tok_s if e.decode_tok_s else 0.0  # same scale
    decode = choice.thompson_speed(mean, spread, e.samples, rng)
    return choice.service_s(e, plan.f.est_prompt_tokens, plan.out, decode, plan.s)


def _spill(plan: _Planner, profile: str, reason: Reason, detail: str) -> Decision:
    chosen = plan.best_backend(profile)
    assert chosen is not None  # profile comes from plan.groups
    if not plan.busy(chosen):
        return _decision(chosen, reason, detail)
    stay = plan.cost(chosen).total
    options = [
        c
        for p in plan.groups
        if p != profile and (c := plan.best_backend(p)) is not None and not plan.busy(c)
    ]
    if options:
        alt = min(options, key=lambda c: (plan.cost(c).total, c.name))
        if plan.cost(alt).total < stay:
            return _decision(alt, "spill", f"spill {profile} busy ({chosen.name}); {detail}")
    return _decision(chosen, reason, f"{detail}; all busy, queued")


def _affinity(plan: _Planner, holder: Candidate, note: str) -> Decision:
    """Stay on the cache holder unless moving pays for its re-prefill (or the queue)."""
    stay = plan.cost(holder)
    trusted = plan.trusted()
    # The holder's decode speed counts once anything is known of it (an explored or spilled
    # session must be able to come back to a trusted better profile cheaply).
    known = holder.profile in plan.est and plan.est[holder.profile].decode_tok_s is not None
    horizon = plan.s.affinity_horizon_requests if known else 0.0
    best: tuple[float, float, Candidate, _Cost] | None = None
    for p in plan.groups:
        c = plan.best_backend(p, exclude=holder.name)
        if c is None:
            continue
        move = plan.cost(c)
        # The queue gain counts once; a decode gain (a trusted target, a holder with data)
        # counts over the following requests of the session.
        gain = (stay.wait - move.wait) + (
            (stay.decode - move.decode) * horizon if p in trusted else 0.0
        )
        margin = gain - move.prefill
        if margin > 0 and (best is None or margin > best[0]):
            best = (margin, gain, c, move)
    if best is None:
        return _decision(holder, "affinity", f"{note}affinity {holder.name}")
    _, gain, target, move = best
    reason: Reason = "spill" if stay.wait > move.wait else "learned"
    return _decision(
        target,
        reason,
        f"{note}left {holder.name}: gain {gain:.1f}s > re-prefill {move.prefill:.1f}s",
    )

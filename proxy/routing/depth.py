"""The routing policy of one process: which replica, and which per-request draft depth.

Pure, like ``policy``: data in, a decision out; randomness only from the ``random.Random``
passed in. Every depth shares the process's prefix cache, so a session's replica is the one
holding its cache, and its depth is chosen afresh for each request, in order:

1. replica: the one holding the session's cache if it has room, else the least loaded.
2. pin: ``X-MTP-Profile`` names a profile: its depth, whatever else decodes.
3. busy (unless the model allows mixed depths): a request that will decode beside others gets
   the depth of the process's current busy epoch (``busy``: one depth for the process while it
   is busy, learned from what it achieved at each depth there).
4. learned: with two or more trusted depths for (class, load level), the best expected goodput
   (output tokens / (prefill + decode time)) measured at that level; a class short of data
   borrows the ranking of its neighbours at the same level.
5. rule: cold start. Alone: short -> max, long code -> min, long prose -> off; beside others
   (a model whose slots may mix depths): ``cold_busy_role`` (off). A depth whose learned
   acceptance is below break-even is skipped.
6. explore: at most ``exploration_rate`` (``cold_exploration_rate`` while cold) of the free
   choices try another depth, untried first, then Thompson sampling; never past
   ``exploration_max_tokens``, and on long contexts never a depth known to lose much.

The load level of a request is what will decode beside it: the requests in flight on the
replica plus itself, or the replica's recent concurrency if higher (so the first request of a
burst is counted busy too). The statistics learn only from requests that decoded at one depth
throughout (the router's caller drops the others; the busy epochs weigh every request by its time
at one depth instead: routing.busy). Why: docs/routing.md ("Decision on one process").
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass, classify_tokens, load_level, neighbours
from proxy.routing.features import RequestFeatures
from proxy.routing.policy import FALLBACK_ORDER, MIN_SD_FRACTION, Reason
from proxy.routing.stats import Estimate


@dataclass(frozen=True, slots=True)
class Replica:
    """One process of a per-request model as the policy sees it."""

    name: str
    ready: bool
    in_flight: int
    slots: int
    holds_session: bool = False
    recent_load: float = 1.0
    """Decayed mean of the requests decoding at its recent admissions (each counting itself)."""
    busy_depth: str | None = None
    """The depth of its current busy epoch (``busy``): what requests beside others run at."""

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
    busy = replica.busy_depth
    if level > 1 and not mixed and busy is not None and busy in depths:
        return decision(busy, "busy", f"{note}busy epoch of {replica.name} at {busy}")
    cls = classify_tokens(features.est_prompt_tokens, features.kind, settings)
    choice = _Choice(features, depths, stats, settings, cls, level)
    profile, reason, detail = choice.place()
    rate = settings.cold_exploration_rate if reason == "rule" else settings.exploration_rate
    tokens = features.est_prompt_tokens
    if settings.learning and tokens < settings.exploration_max_tokens and rng.random() < rate:
        explored = choice.explore(profile, rng)
        if explored is not None:
            profile, reason, detail = explored, "explore", f"explore {explored} (was {profile})"
    return decision(profile, reason, f"{note}{detail}")


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
    ) -> None:
        self.f, self.depths, self.s, self.cls, self.level = features, depths, settings, cls, level
        own = {p: e for p, e in stats.view_at(cls, level).items() if p in depths}
        self.est, self.source = own, cls
        if self._trusted_count(own) < 2:
            for donor in neighbours(cls, settings):
                view = {p: e for p, e in stats.view_at(donor, level).items() if p in depths}
                if self._trusted_count(view) >= 2:
                    self.est = {**view, **{p: e for p, e in own.items() if e.trusted}}
                    self.source = donor
                    break
        learned = [e.output_tokens for e in self.est.values() if e.trusted and e.output_tokens]
        out = max(learned) if learned else float(settings.prior_output_tokens)
        if features.max_tokens is not None:
            out = float(min(out, features.max_tokens))
        self.out = max(out, 1.0)

    @staticmethod
    def _trusted_count(view: Mapping[str, Estimate]) -> int:
        return sum(1 for e in view.values() if e.trusted)

    def trusted(self) -> dict[str, Estimate]:
        return {p: e for p, e in self.est.items() if e.trusted}

    def expected_s(self, profile: str, decode: float | None = None) -> float:
        e = self.est[profile]
        prefill = e.prefill_tok_s or self.s.prior_prefill_tok_s
        speed = decode if decode is not None else (e.decode_tok_s or self.s.prior_decode_tok_s)
        return self.f.est_prompt_tokens / prefill + self.out / speed

    def guarded(self, profile: str) -> bool:
        """A drafting depth whose learned acceptance is below break-even."""
        e = self.est.get(profile)
        if e is None or self.depths[profile] == 0:
            return False
        acc = e.acceptance_trusted(self.s.min_samples)
        return acc is not None and acc < self.s.break_even_acceptance

    def place(self) -> tuple[str, Reason, str]:
        trusted = self.trusted()
        at = f"{self.cls.label}@{self.level}"
        if len(trusted) < 2:
            return self._rule(at)
        best = min(trusted, key=lambda p: (self.expected_s(p), p))
        speeds = ", ".join(f"{p} {trusted[p].decode_tok_s or 0:.1f}" for p in sorted(trusted))
        borrowed = f" (from {self.source.label})" if self.source != self.cls else ""
        return best, "learned", f"learned {at}{borrowed}: {speeds} tok/s"

    def _rule(self, at: str) -> tuple[str, Reason, str]:
        s = self.s
        if self.level > 1:
            role = s.cold_busy_role
        elif self.f.est_prompt_tokens >= s.long_context_tokens:
            role = s.cold_long_code_role if self.f.kind == "code" else s.cold_long_prose_role
        else:
            role = s.cold_short_role
        skipped = []
        for r in FALLBACK_ORDER[role]:
            profile = s.role_profile(r)
            if profile not in self.depths:
                continue
            if self.guarded(profile):
                skipped.append(f"{profile} below break-even")
                continue
            why = f" ({'; '.join(skipped)})" if skipped else ""
            return profile, "rule", f"rule {at} -> {role}{why}"
        shallowest = min(self.depths, key=lambda p: (self.depths[p], p))
        return shallowest, "fallback", f"fallback {at}: no role profile usable"

    def explore(self, chosen: str, rng: random.Random) -> str | None:
        """An exploration target, or None (Thompson sampling kept the choice)."""
        long_ctx = self.f.est_prompt_tokens >= self.s.long_context_tokens
        trusted = self.trusted()
        best = self.expected_s(chosen) if chosen in trusted else None
        eligible = []
        for p in sorted(self.depths):
            if p == chosen or (long_ctx and self.guarded(p)):
                continue
            worse = (
                best is not None
                and p in trusted
                and best / self.expected_s(p) < 1.0 - self.s.exploration_max_regret
            )
            if not (long_ctx and worse):
                eligible.append(p)
        if not eligible:
            return None
        untried = [p for p in eligible if p not in trusted]
        if untried:
            return min(untried, key=lambda p: (self.est[p].count if p in self.est else 0, p))
        if chosen not in trusted:
            return None
        draws = {p: self._thompson(p, rng) for p in [chosen, *eligible]}
        pick = min(draws, key=lambda p: (draws[p], p))
        return None if pick == chosen else pick

    def _thompson(self, profile: str, rng: random.Random) -> float:
        e = self.est[profile]
        mean = e.decode_tok_s or self.s.prior_decode_tok_s
        sd = max(e.decode_sd, MIN_SD_FRACTION * mean) / max(e.samples, 1.0) ** 0.5
        return self.expected_s(profile, max(rng.gauss(mean, sd), 0.05 * mean))

"""Routing glue: features in, a backend out; telemetry in, learned statistics out.

The decision itself is `policy.decide` for a pool and `depth.decide_depth` for a model served by
one process (both pure). This module owns the state around them: the learned
statistics, session affinity (session key -> backend that holds its prefix cache), the routing
mix, and turning a finished relay into an observation.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from proxy.apis import Api
from proxy.config.routing import RoutingSettings, decay_factor
from proxy.routing.busy import BusyDepths, held_cold, next_busy_depth
from proxy.routing.calibration import Calibration
from proxy.routing.classes import RequestClass, bucket_contexts, classify, load_level
from proxy.routing.collapse import CollapseGuard, suspect
from proxy.routing.depth import Replica, decide_depth
from proxy.routing.features import RequestFeatures, extract_features
from proxy.routing.policy import Candidate, decide
from proxy.routing.slot_caches import SlotCaches
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import (
    Observation,
    ParsedUsage,
    SpecCounters,
    StreamTelemetry,
    make_observation,
    parse_body,
)
from proxy.serving.backends import LiveBackend, LiveBackends
from proxy.serving.forward import Relayed

log = structlog.get_logger("proxy.routing")
BUSY_CONTEXT_PRIOR = 2.0
"""Admissions' worth of ``long_context_tokens`` in a process's busy context before it has any
(``RecentContext``)."""
CLIENT_PROFILE = "client"
"""The label of a request that set a depth of its own that no profile has."""


@dataclass(frozen=True)
class Route:
    backend: LiveBackend
    profile: str
    reason: str
    detail: str
    request_class: RequestClass
    in_flight: int = 0
    """Other requests on the backend when it was chosen (the load its speed is measured at)."""
    cache_key: object = None
    """What SlotCaches knows this request's slot by (released when it is observed)."""
    depth: int | None = None
    """A per-request process: the draft depth to inject ("speculative.n_max"); else None."""
    level: int = 0
    """A per-request process: the load level the depth was chosen at (statistics key)."""

    @property
    def class_label(self) -> str:
        return self.request_class.label


@dataclass(frozen=True, slots=True)
class RecentContext:
    """A process's recent admissions' prompt tokens, decayed per admission like its recent
    load: the context its calibrated busy gap is carried to (``Router._busy_context``).

    Blended with ``BUSY_CONTEXT_PRIOR`` admissions of ``long_context_tokens`` (an agent's
    prompt grows there, and the first busy stretch is where a wrong cold depth costs most:
    queues form behind it). The prior decays with the admissions too: counted at full weight
    beside a decayed count that levels off near 12 (half-life 8), it kept a sixth of the
    blend for good, and a box that had served nothing but short chats still carried its
    short-prompt gap to ~5k tokens (1.14x measured at 4 slots fell under the 5 % margin)."""

    count: float = 0.0
    total: float = 0.0
    squares: float = 0.0
    prior: float = BUSY_CONTEXT_PRIOR
    code: float = 0.0
    """The part of ``total`` that was code."""

    def admit(self, tokens: float, decay: float, kind: str) -> RecentContext:
        return RecentContext(
            self.count * decay + 1.0,
            self.total * decay + tokens,
            self.squares * decay + tokens**2,
            self.prior * decay,
            self.code * decay + (tokens if kind == "code" else 0.0),
        )

    def kinds(self) -> dict[str, float] | None:
        """The admissions' content, kind -> share of their tokens (None before any): what the
        calibrated busy gap is taken for (a process serving agents decodes mostly code)."""
        if self.total <= 0:
            return None
        return {"code": self.code / self.total, "prose": 1.0 - self.code / self.total}

    def tokens(self, prior_tokens: float) -> float:
        """Weighted by tokens (a long agent prompt holds the process, and every step beside
        it, far longer than a chat: counted per request, short chats hid it)."""
        mean = self.squares / self.total if self.total > 0 else 0.0
        return (self.count * mean + self.prior * prior_tokens) / (self.count + self.prior)


@dataclass(frozen=True)
class LearnedRow:
    model: str
    request_class: str
    profile: str
    decode_tok_s: float
    acceptance: float
    samples: float


@dataclass(frozen=True)
class PerRequestModel:
    """A model served by one process (per replica): its profiles are per-request depths."""

    depths: Mapping[str, int]
    mixed: bool = False  # may requests at different depths decode at once on one process


class Router:
    def __init__(
        self,
        settings: RoutingSettings,
        backends: LiveBackends,
        stats: LearnedStats | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.stats = stats or LearnedStats(settings)
        self._rng = rng or random.Random(settings.seed)
        # key -> (backend, last used), least recently used first; at most max_sessions.
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._caches = SlotCaches()
        self.mix: Counter[tuple[str, str, str]] = Counter()  # (model, profile, reason)
        self.per_request: dict[str, PerRequestModel] = {}  # set by the app from the plans
        self.calibrated: dict[str, Calibration] = {}
        """Backend name -> its start-up calibration (proxy.routing.calibrate), once found."""
        self.guards: dict[str, CollapseGuard] = {}
        """Backend name -> its acceptance-collapse guard (proxy.routing.collapse)."""
        self.clock: Callable[[], float] = time.monotonic  # the guards' back-off clock
        self._recent_context: dict[str, RecentContext] = {}
        """Backend name -> its admissions' prompt tokens (``_busy_context``)."""

        self._load_decay = 0.5 ** (1.0 / settings.load_half_life_requests)
        self._busy_decay = decay_factor(settings.half_life_samples)

    def features(
        self, api: Api, model: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> RequestFeatures:
        return extract_features(
            api,
            {**body, "model": model} if body.get("model") != model else body,
            chars_per_token=self.stats.calibrator.chars_per_token(model),
            session_header=headers.get(self.settings.session_header),
            pin_header=headers.get(self.settings.pin_header),
        )

    def route(
        self, model: str, features: RequestFeatures, *, exclude: Collection[str]
    ) -> Route | None:
        per_request = self.per_request.get(model)
        if per_request is not None:
            return self._route_depth(model, per_request, features, exclude)
        holder = self._holder(features.session_key)
        pinned = self.pinned_profile(model, features, exclude)
        backends = self.backends.of_model(model)
        resident_tokens = self.settings.resident_session_tokens
        for b in backends:
            self._caches.trim(b.name, b.in_flight, b.slots)
        candidates = [
            # A full backend is no candidate: llama-server would queue the request out of
            # sight; the proxy spills it elsewhere or queues it in order (proxy.serving.admission).
            # Except the session's cache holder: queueing there can cost far less than
            # re-processing a long prompt elsewhere, and the policy weighs exactly that. And
            # the profile a client pinned: it asked for that profile, full or not.
            Candidate(
                b.name,
                b.profile,
                b.has_room or (b.ready and (b.name == holder or b.profile == pinned)),
                b.in_flight,
                b.slots,
                b.name == holder,
                self._caches.victim_tokens(b.name, features.session_key, b.slots),
                self._caches.resident(b.name, features.session_key, resident_tokens),
            )
            for b in backends
            if b.name not in exclude
        ]
        decision = decide(
            features, candidates, self.stats.for_model(model), self.settings, self._draws(features)
        )
        if decision is None:
            return None
        backend = self.backends.get(decision.backend)
        if backend is None:
            return None
        return self._placed(
            model, backend, features, decision.profile, decision.reason, decision.detail
        )

    def _route_depth(
        self,
        model: str,
        per_request: PerRequestModel,
        features: RequestFeatures,
        exclude: Collection[str],
    ) -> Route | None:
        """One process per replica: a replica and a per-request depth (routing.depth)."""
        holder = self._holder(features.session_key)
        now = self.clock()
        guarded = self.settings.collapse_guard
        replicas = [
            Replica(
                b.name,
                b.ready,
                b.in_flight,
                b.slots,
                b.name == holder,
                b.recent_load,
                self._busy_depth(b, per_request, features, calm=b.in_flight == 0),
                self.calibrated.get(b.name),
                self._alone_points(b.name, per_request.depths),
                collapsed=guarded and self._guard(b.name).collapsed,
                trial=guarded and self._guard(b.name).trial_due(now),
            )
            for b in self.backends.of_model(model)
            if b.name not in exclude
        ]
        decision = decide_depth(
            features,
            replicas,
            per_request.depths,
            self.stats.for_model(model),
            self.settings,
            self._draws(features),
            mixed=per_request.mixed,
        )
        if decision is None:
            return None
        backend = self.backends.get(decision.backend)
        if backend is None:
            return None
        if decision.reason == "busy":
            busy = self.stats.busy[backend.name]
            busy.left -= 1
            busy.sent[decision.profile] += 1
        elif decision.reason == "collapsed" and decision.depth > 0:
            self._guard(backend.name).begin_trial()
        decay = self._load_decay
        backend.recent_load = backend.recent_load * decay + (backend.in_flight + 1) * (1 - decay)
        recent = self._recent_context.get(backend.name, RecentContext())
        admitted = recent.admit(features.est_prompt_tokens, decay, features.kind)
        self._recent_context[backend.name] = admitted

        route = self._placed(
            model, backend, features, decision.profile, decision.reason, decision.detail
        )
        return replace(route, depth=decision.depth, level=decision.level)

    def _alone_points(
        self, backend: str, depths: Mapping[str, int]
    ) -> dict[str, dict[str, tuple[float, float]]]:
        """Per kind and profile, what the backend's calibration measured alone: the profiles
        at its depth 0 and at its deepest depth."""
        calibration = self.calibrated.get(backend)
        if calibration is None:
            return {}
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for cell in calibration.alone_kinds:
            for profile, depth in depths.items():
                if depth == cell.depth:
                    out.setdefault(cell.kind, {})[profile] = (cell.context, cell.tok_s)
        return out

    def _busy_context(
        self, backend: str, features: RequestFeatures
    ) -> tuple[float, dict[str, float] | None]:
        """The context a busy process's requests decode at, and their content (kind -> share
        of their tokens): ``RecentContext``, with the request being admitted counted (the
        process's first busy epoch is chosen with one admission before it: without it, the
        prior alone decided)."""
        recent = self._recent_context.get(backend, RecentContext())
        recent = recent.admit(features.est_prompt_tokens, self._load_decay, features.kind)
        return recent.tokens(float(self.settings.long_context_tokens)), recent.kinds()

    def client_depth(self, model: str, route: Route, depth: int | None) -> Route:
        """The route of a request that set its own depth (``"speculative.n_max"``) on a process
        serving per-request depths: it runs at that depth, so it is labelled, leased and learned
        as the profile of that depth (``CLIENT_PROFILE`` when no profile has it, or the value is
        not a depth), reason "client". A busy admission the router counted for it is given back:
        it is not one of the epoch's."""
        per_request = self.per_request.get(model)
        if per_request is None or route.depth is None:
            return route
        if route.reason == "busy":
            busy = self.stats.busy[route.backend.name]
            busy.left += 1
            busy.sent[route.profile] -= 1
        self.mix[(model, route.profile, route.reason)] -= 1
        if self.mix[(model, route.profile, route.reason)] <= 0:
            del self.mix[(model, route.profile, route.reason)]
        depths = per_request.depths
        profile = next((p for p in sorted(depths) if depths[p] == depth), CLIENT_PROFILE)
        self.mix[(model, profile, "client")] += 1
        detail = f"the client's own depth {depth}"
        ran_at = route.depth if depth is None else depth
        return replace(route, profile=profile, reason="client", detail=detail, depth=ran_at)

    def _busy_depth(
        self,
        live: LiveBackend,
        per_request: PerRequestModel,
        features: RequestFeatures,
        *,
        calm: bool,
    ) -> str | None:
        """The depth of the backend's current busy epoch; the next epoch's once it ran out.

        Cold, the process starts at ``cold_busy_role``, or where its start-up calibration
        measured the faster depth at the load level it is busy at (its recent load: 2-3
        decoding or 4+), carried to the context and content it serves; when that is not
        ``cold_busy_role``, the other depth's first epoch comes as soon as the cold one has its
        samples, idle process or not. Once the process has compared the two depths the cold
        pick holds (``held_cold``). The calibration's gap carried to each class's context is
        the prior of the classes not yet run at the other depth (routing.busy)."""
        if per_request.mixed:
            return None
        backend = live.name
        state = self.stats.busy.setdefault(backend, BusyDepths())
        if state.profile is None or state.left <= 0 or calm:
            depths = per_request.depths
            settings = self.settings
            calibration = self.calibrated.get(backend)
            # The level it is busy at (2-3 decoding or 4+), from its recent load.
            level = load_level(min(max(live.recent_load, 2.0), live.slots), settings)
            context, kinds = self._busy_context(backend, features)
            role = calibration.cold_role(level, context, kinds) if calibration else None
            cold = settings.role_profile(role or settings.cold_busy_role)
            shallowest = min(depths, key=lambda p: (depths[p], p))
            deepest = max(depths, key=lambda p: (depths[p], p))
            first = cold if cold in depths else shallowest
            if state.cold in depths:
                first = held_cold(state, first)
            # The other depth measured: the deepest, or the shallowest when the cold pick is
            # the deepest (cold_busy_role = "max" still learns whether plain decoding is faster).
            other = deepest if first != deepest else shallowest
            epoch = next_busy_depth(
                state,
                first,
                other,
                settings.min_samples,
                settings.busy_epoch_admissions,
                calm=calm,
                priors=_priors(calibration, settings, other == deepest),
                confirm=role is not None and role != settings.cold_busy_role,
            )
            state.profile, state.exploring, state.cold = epoch.profile, epoch.exploring, first
            state.left = epoch.admissions or settings.busy_epoch_admissions
        return state.profile

    def _placed(
        self,
        model: str,
        backend: LiveBackend,
        features: RequestFeatures,
        profile: str,
        reason: str,
        detail: str,
    ) -> Route:
        """The bookkeeping of a decision, whichever shape made it: the session's holder, the
        slot cache it takes, the routing mix."""
        if features.session_key is not None:
            self._remember(features.session_key, backend.name)
        key = self._caches.use(
            backend.name, features.session_key, features.est_prompt_tokens, backend.slots
        )
        self.mix[(model, profile, reason)] += 1
        cls = classify(features, self.settings)
        return Route(backend, profile, reason, detail, cls, backend.in_flight, key)

    def _remember(self, session_key: str, backend: str) -> None:
        sessions = self._sessions
        sessions[session_key] = (backend, time.monotonic())
        sessions.move_to_end(session_key)
        while len(sessions) > self.settings.max_sessions:
            sessions.popitem(last=False)

    def _draws(self, features: RequestFeatures) -> random.Random:
        """The random source of one decision. Seeded: drawn from the seed and the request's own
        content (session key, prompt size), so a request's exploration draws do not depend on
        how many decisions happened to come before it; one shared stream turned every timing
        race (which of two requests is decided first) into different draws for all later
        requests, and repeated benchmark runs apart. Unseeded: the shared fresh stream."""
        if self.settings.seed is None:
            return self._rng
        key = f"{self.settings.seed}/{features.session_key}/{features.prompt_chars}"
        key += f"/{features.token_ids}/{features.images}"
        return random.Random(key)  # a str seed is hashed with SHA-512: the same in every run

    def pinned_profile(
        self, model: str, features: RequestFeatures, exclude: Collection[str] = ()
    ) -> str | None:
        """The profile a client pinned with the pin header, if a backend of it is ready."""
        if not features.pinned_profile:
            return None
        profile = self.settings.resolve_pin(features.pinned_profile)
        per_request = self.per_request.get(model)
        if per_request is not None:
            # Every replica serves every profile; a pin waits for a free slot like any request.
            return None
        ready = any(
            b.profile == profile and b.name not in exclude
            for b in self.backends.ready_of_model(model)
        )
        return profile if ready else None

    def _holder(self, session_key: str | None) -> str | None:
        if session_key is None:
            return None
        entry = self._sessions.get(session_key)
        if entry is None:
            return None
        name, last_used = entry
        if time.monotonic() - last_used > self.settings.session_idle_ttl_s:
            del self._sessions[session_key]
            return None
        return name if self._caches.holds(name, session_key) else None

    def forget_idle_sessions(self) -> int:
        """Drop sessions idle past the TTL (bounded memory); returns how many went."""
        cutoff = time.monotonic() - self.settings.session_idle_ttl_s
        stale = [key for key, (_, used) in self._sessions.items() if used < cutoff]
        for key in stale:
            del self._sessions[key]
        return len(stale)

    def stream_telemetry(self, api: Api) -> StreamTelemetry:
        return StreamTelemetry(api)

    def usage(
        self, api: Api, relayed: Relayed, sink: StreamTelemetry | None, now: float
    ) -> ParsedUsage:
        if relayed.streamed and sink is not None:
            return sink.result(now)
        return parse_body(api, relayed.body)

    def observe(
        self,
        route: Route,
        features: RequestFeatures,
        usage: ParsedUsage,
        *,
        sent_at: float,
        done_at: float,
        spec_delta: SpecCounters | None = None,
        learn: bool = True,
        single_depth_s: float = 0.0,
        single_depth_load: float = 0.0,
        single_depth_tokens: int = 0,
        others_at_end: int | None = None,
    ) -> Observation:
        """The request's observation; learned from unless ``learn`` is False (it ran at a
        depth the client set itself, which is not its route's profile, or beside another
        depth). ``single_depth_s``: how long it ran while its process was busy at its depth only
        (what the busy epochs learn from, routing.busy), ``single_depth_load`` how many requests
        decoded together then, on average, ``single_depth_tokens`` the tokens it streamed then
        (0: not streamed, or none then). ``others_at_end``: the other requests on its backend
        when it ended (default: now)."""
        self._caches.release(route.backend.name, route.cache_key)
        scale = self.settings.clock_scale
        if scale != 1.0:  # every clock reading is scaled: their differences scale alike
            usage = replace(
                usage,
                first_token_at=_scaled(usage.first_token_at, scale),
                last_token_at=_scaled(usage.last_token_at, scale),
            )
            sent_at, done_at = sent_at * scale, done_at * scale
        observation = make_observation(
            usage,
            backend=route.backend.name,
            profile=route.profile,
            request_class=route.request_class,
            sent_at=sent_at,
            done_at=done_at,
            spec_delta=spec_delta,
        )
        busy = self.stats.busy.get(route.backend.name) if route.depth is not None else None
        if busy is not None and route.reason == "busy":
            busy.finished[route.profile] += 1
        settings = self.settings
        parts: list[Callable[[], None]] = []
        speed = observation.decode_tok_s
        if busy is not None and settings.learning and speed and observation.output_tokens:
            # Its time at one depth, of which no more than it spent decoding (not its prefill);
            # streamed, its speed over that time alone (``Lease.streamed``).
            seconds = min(single_depth_s * scale, observation.output_tokens / speed)
            busy_speed = speed
            if single_depth_tokens > 0 and single_depth_s > 0:
                seconds = single_depth_s * scale
                busy_speed = single_depth_tokens / seconds
            busy_level = load_level(single_depth_load, settings)
            parts.append(
                functools.partial(
                    busy.observe,
                    route.request_class,
                    busy_level,
                    route.profile,
                    busy_speed,
                    seconds,
                    self._busy_decay,
                )
            )
        if settings.learning and learn:
            # The load over the request's life: the mean of the others in flight when it was
            # sent and when it ended (the lease is released by now: in_flight counts others).
            at_end = route.backend.in_flight if others_at_end is None else others_at_end
            load = (route.in_flight + at_end) / 2.0
            # A per-request process keys its statistics by load level (this request counted).
            level = load_level(load + 1.0, settings) if route.depth is not None else 0
            parts.append(
                functools.partial(
                    self.stats.observe,
                    route.request_class,
                    route.profile,
                    observation,
                    model=features.model,
                    load=load,
                    level=level,
                )
            )

        def apply() -> None:
            for part in parts:
                part()

        fate = self._guarded(route, features.model, observation)
        if fate == "learn":
            apply()
        elif fate == "hold":
            self.guards[route.backend.name].hold(
                apply,
                observation.draft_n or 0,
                observation.draft_n_accepted or 0,
                self._expected_acceptance(route, features.model),
            )
        if settings.learning and learn and observation.context_tokens:
            self.stats.calibrator.observe(features, observation.context_tokens)
        return observation

    def _guarded(self, route: Route, model: str, obs: Observation) -> str:
        """What the collapse guard makes of a finished request (routing.collapse): "learn" it,
        "hold" its learning until the window's verdict, or "skip" it (it drafted during a
        collapse, or as its trial: what was learned before stays)."""
        drafted, accepted = obs.draft_n, obs.draft_n_accepted
        if route.depth is None or not self.settings.collapse_guard:
            return "learn"
        guard = self._guard(route.backend.name)
        if not drafted or accepted is None:
            return "learn"
        expected = self._expected_acceptance(route, model)
        trial = route.reason == "collapsed"
        verdict = guard.observe(drafted, accepted, expected, self.clock(), trial=trial)
        where = {"backend": route.backend.name, "model": model}
        if verdict == "collapsed":
            log.warning(
                "acceptance_collapsed",
                **where,
                cause=guard.cause,
                serving="depth 0",
                next_trial_in_s=round(guard.backoff_s, 1),
                dropped=guard.dropped,
                known_causes="MTP bugs that drive acceptance to ~0 (llama.cpp #27151, #27572, "
                "#23636) or a drafter decaying over uptime",
            )
        elif verdict == "still":
            log.warning(
                "acceptance_still_collapsed",
                **where,
                trial_acceptance=round(guard.last.acceptance, 4),
                trial_drafted=round(guard.last.drafted),
                next_trial_in_s=round(guard.backoff_s, 1),
            )
        elif verdict == "recovered":
            log.info(
                "acceptance_recovered",
                **where,
                trial_acceptance=round(guard.last.acceptance, 4),
                expected=round(guard.last.expected / max(guard.last.drafted, 1.0), 4),
                trials=guard.trials,
            )
        if trial or guard.collapsed or verdict in ("collapsed", "still"):
            return "skip"
        return "hold" if suspect(drafted, accepted, expected) else "learn"

    def _guard(self, backend: str) -> CollapseGuard:
        guard = self.guards.get(backend)
        if guard is None:
            s = self.settings
            guard = self.guards[backend] = CollapseGuard(s.collapse_retry_s, s.collapse_retry_max_s)
        return guard

    def _expected_acceptance(self, route: Route, model: str) -> float:
        """What the request's class had learned to accept at its depth (any load level), else
        what the backend's calibration measured, else break-even."""
        learned = self.stats.learned_acceptance(route.request_class, route.profile, model)
        if learned is not None:
            return learned
        calibration = self.calibrated.get(route.backend.name)
        measured = calibration.acceptance() if calibration is not None else None
        return measured if measured is not None else self.settings.break_even_acceptance

    def learned_rows(self) -> list[LearnedRow]:
        return [
            LearnedRow(
                model=str(row["model"]),
                request_class=str(row["class"]),
                profile=str(row["profile"]),
                decode_tok_s=_number(row["decode_tok_s"]),
                acceptance=_number(row["acceptance"]),
                samples=_number(row["weight"]),
            )
            for row in self.stats.table()
        ]

    def snapshot(self) -> dict[str, Any]:
        mix = [
            {"model": model, "profile": profile, "reason": reason, "count": count}
            for (model, profile, reason), count in sorted(self.mix.items())
        ]
        learned = [{**row, "request_class": row["class"]} for row in self.stats.table()]
        return {
            "mix": mix,
            "learned": learned,
            "sessions": len(self._sessions),
            "busy": {name: busy.report() for name, busy in sorted(self.stats.busy.items())},
            "calibration": {
                name: c.report(self.settings.concurrency_levels)
                for name, c in sorted(self.calibrated.items())
            },
            "collapse": {
                name: guard.report(self.clock()) for name, guard in sorted(self.guards.items())
            },
            "changes": list(self.stats.changes),
            "state": self.stats.load_report,
        }


def _priors(
    calibration: Calibration | None, settings: RoutingSettings, deeper: bool
) -> Callable[[str, int], float | None] | None:
    """The calibrated log gap of the busy epochs' other depth against the cold one, per class
    and busy level, carried to the class's context: deepest vs depth 0 (``deeper``), or its
    opposite."""
    if calibration is None:
        return None
    contexts = bucket_contexts(settings.context_buckets)

    def prior(label: str, level: int) -> float | None:
        bucket, _, kind = label.partition("/")
        context = contexts.get(bucket, 0.0)
        gap = calibration.log_gap(level, context, kind or None) if level > 1 else None
        return None if gap is None else (gap if deeper else -gap)

    return prior


def _scaled(t: float | None, scale: float) -> float | None:
    return None if t is None else t * scale


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")

"""Routing glue: features in, a backend and depth out; a finished request in, learning out.

The decision itself is ``policy.decide`` for a pool and ``depth.decide_depth`` for a model served
by one process (both pure). The router gathers their inputs from the parts that keep state, each
its own module: the sessions and the prompt caches that hold them (``sessions``), each process's
recent admissions (``load``) and busy epochs (``busy``), its single-depth clock (``depth_clock``),
its start-up calibration and its collapse guard (``collapse_guards``), and the learned statistics
(``stats``). It reads the backends through the views routing owns (``views``) and never holds a
process or a connection: the caller acts on the ``Route`` it returns, runs the request inside
``running`` and hands back one ``Outcome``.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from proxy.apis import Api
from proxy.config.routing import RoutingSettings
from proxy.routing.busy import BusyEpochs
from proxy.routing.calibration import Calibration
from proxy.routing.choice import Reason
from proxy.routing.classes import RequestClass, classify, load_level
from proxy.routing.collapse_guards import CollapseGuards, Fate
from proxy.routing.depth import Replica, decide_depth
from proxy.routing.depth_clock import DecodeRun, DepthClock, DepthRecord
from proxy.routing.features import RequestFeatures, extract_features
from proxy.routing.load import RecentLoad
from proxy.routing.logprobs import DETAIL, at_depth_zero
from proxy.routing.plausibility import dropped, implausible
from proxy.routing.policy import Candidate, decide
from proxy.routing.sessions import Sessions
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation, ParsedUsage, SpecCounters, make_observation
from proxy.routing.views import B_co, Backends, BackendView

LEVEL_ANY = "any"
"""The load level of what a pool learned (its processes learn across loads)."""
CLIENT_PROFILE = "client"
"""The label of a request that set a depth of its own that no profile has."""
V = TypeVar("V", bound=BackendView)


@dataclass(frozen=True)
class Route(Generic[B_co]):
    backend: B_co
    profile: str
    reason: Reason
    detail: str
    request_class: RequestClass
    in_flight: int = 0
    """Other requests on the backend when it was chosen (the load its speed is measured at)."""
    cache_key: object = None
    """What ``Sessions`` knows this request's slot by (released when it is observed)."""
    depth: int | None = None
    """A process serving per-request depths: the draft depth to send; else None."""
    level: int = 0
    """... and the load level the depth was chosen at (statistics key)."""

    @property
    def class_label(self) -> str:
        return self.request_class.label


@dataclass(frozen=True)
class Outcome(Generic[B_co]):
    """A finished request, as the serving layer hands it back: all the router learns from."""

    route: Route[B_co]
    features: RequestFeatures
    usage: ParsedUsage
    sent_at: float
    done_at: float
    run: DepthRecord = field(default_factory=DepthRecord)
    """What its run says about its depth (``DecodeRun.record``)."""
    others_at_end: int | None = None
    """The other requests on its backend when it ended (default: when it is observed)."""
    spec_delta: SpecCounters | None = None
    """The backend's /metrics draft counters' movement over it, where it ran alone."""


@dataclass(frozen=True)
class LearnedRow:
    model: str
    request_class: str
    """The class alone (``<4k/code``); its load level is ``load_level``."""
    load_level: str
    """The requests decoding together it was measured at (1, 2, 4: 2-3, 4+), or ``any`` on a
    pool, which learns across loads."""
    profile: str
    decode_tok_s: float
    acceptance: float
    samples: float


@dataclass(frozen=True)
class PerRequestModel:
    """A model served by one process (per replica): its profiles are per-request depths."""

    depths: Mapping[str, int]
    mixed: bool = False  # may requests at different depths decode at once on one process


class Router(Generic[V]):
    def __init__(
        self,
        settings: RoutingSettings,
        backends: Backends[V],
        stats: LearnedStats | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.backends = backends
        self._stats = stats or LearnedStats(settings)
        self.busy = BusyEpochs(settings, self._stats.busy)
        self.sessions = Sessions(settings)
        self._settings = settings
        self._rng = rng or random.Random(settings.seed)
        self.mix: Counter[tuple[str, str, str]] = Counter()  # (model, profile, reason)
        self.per_request: dict[str, PerRequestModel] = {}  # set by the app from the plans
        self.calibrated: dict[str, Calibration] = {}
        """Backend name -> its start-up calibration (proxy.routing.calibrate), once found."""
        self.guards = CollapseGuards(settings.collapse_retry_s, settings.collapse_retry_max_s)
        self.clock: Callable[[], float] = time.monotonic  # the guards' back-off clock
        self.loads: dict[str, RecentLoad] = {}
        """Backend name -> its recent admissions (``load``)."""
        self.clocks: dict[str, DepthClock] = {}
        """Backend name -> its single-depth clock (``depth_clock``)."""

    @property
    def settings(self) -> RoutingSettings:
        return self._settings

    @settings.setter
    def settings(self, settings: RoutingSettings) -> None:
        """A reload's settings (the routing roles), for every part that reads them."""
        self._settings = self.busy.settings = self.sessions.settings = settings

    @property
    def stats(self) -> LearnedStats:
        return self._stats

    @stats.setter
    def stats(self, stats: LearnedStats) -> None:
        """The learned statistics another writer saved (a reload): the busy epochs with them."""
        self._stats = stats
        self.busy.states = stats.busy

    def features(
        self, api: Api, model: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> RequestFeatures:
        return extract_features(
            api,
            {**body, "model": model} if body.get("model") != model else body,
            chars_per_token=self.stats.calibrator.chars_per_token(model),
            session_header=self.settings.session_of(headers),
            pin_header=headers.get(self.settings.pin_header),
        )

    def route(
        self, model: str, features: RequestFeatures, *, exclude: Collection[str]
    ) -> Route[V] | None:
        per_request = self.per_request.get(model)
        if per_request is not None:
            return self._route_depth(model, per_request, features, exclude)
        holder = self.sessions.holder(features.session_key)
        pinned = self.pinned_profile(model, features, exclude)
        backends = self.backends.of_model(model)
        caches, resident_tokens = self.sessions.caches, self.settings.resident_session_tokens
        for b in backends:
            caches.trim(b.name, b.in_flight, b.slots)
        candidates = [
            # A full backend is no candidate: llama-server would queue the request out of
            # sight; the proxy spills it elsewhere or queues it in order (the admission queue).
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
                caches.victim_tokens(b.name, features.session_key, b.slots),
                caches.resident(b.name, features.session_key, resident_tokens),
            )
            for b in backends
            if b.name not in exclude
        ]
        logprobs = features.logprobs and self.settings.logprobs_at_depth_zero
        asked = (
            replace(features, pinned_profile=self.settings.profile_off) if logprobs else features
        )
        decision = decide(
            asked, candidates, self.stats.for_model(model), self.settings, self._draws(features)
        )
        backend = self.backends.get(decision.backend) if decision is not None else None
        if decision is None or backend is None:
            return None
        if logprobs:  # on the off profile where it has room; at depth 0 wherever it runs
            route = self._placed(model, backend, features, decision.profile, "logprobs", DETAIL)
            return replace(route, depth=0)
        return self._placed(
            model, backend, features, decision.profile, decision.reason, decision.detail
        )

    def _route_depth(
        self,
        model: str,
        per_request: PerRequestModel,
        features: RequestFeatures,
        exclude: Collection[str],
    ) -> Route[V] | None:
        """One process per replica: a replica and a per-request depth (routing.depth)."""
        holder = self.sessions.holder(features.session_key)
        replicas = [
            self._replica(b, per_request, features, holds_session=b.name == holder)
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
        backend = self.backends.get(decision.backend) if decision is not None else None
        if decision is None or backend is None:
            return None
        if features.logprobs and self.settings.logprobs_at_depth_zero:
            decision = at_depth_zero(decision, per_request.depths, self.settings.profile_off)
        if decision.reason == "collapsed" and decision.depth > 0:
            self.guards.of(backend.name).begin_trial()
        decay = 0.5 ** (1.0 / self.settings.load_half_life_requests)
        recent = self.loads.get(backend.name, RecentLoad())
        self.loads[backend.name] = recent.admit(
            backend.in_flight, features.est_prompt_tokens, features.kind, decay
        )
        detail = decision.detail + _load_words(decision.level, backend.in_flight, recent.load)
        route = self._placed(model, backend, features, decision.profile, decision.reason, detail)
        return replace(route, depth=decision.depth, level=decision.level)

    def _replica(
        self,
        backend: V,
        per_request: PerRequestModel,
        features: RequestFeatures,
        *,
        holds_session: bool,
    ) -> Replica:
        """A process as ``decide_depth`` sees it; its busy epoch moves on here if it ran out."""
        name, guarded = backend.name, self.settings.collapse_guard
        recent = self.loads.get(name, RecentLoad())
        calibration = self.calibrated.get(name)
        busy = None
        if not per_request.mixed:
            calm = backend.in_flight == 0
            busy = self.busy.depth(
                name, per_request.depths, backend.slots, recent, calibration, features, calm=calm
            )
        return Replica(
            name,
            backend.ready,
            backend.in_flight,
            backend.slots,
            holds_session,
            recent.load,
            busy,
            calibration,
            self._alone_points(name, per_request.depths),
            collapsed=guarded and self.guards.of(name).collapsed,
            trial=guarded and self.guards.of(name).trial_due(self.clock()),
        )

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

    def client_depth(self, model: str, route: Route[V], depth: int | None) -> Route[V]:
        """The route of a request that set its own depth (``"speculative.n_max"``) on a process
        serving per-request depths: it runs at that depth, so it is labelled, leased and learned
        as the profile of that depth (``CLIENT_PROFILE`` when no profile has it, or the value is
        not a depth), reason "client"."""
        per_request = self.per_request.get(model)
        if per_request is None or route.depth is None:
            return route
        self.mix[(model, route.profile, route.reason)] -= 1
        if self.mix[(model, route.profile, route.reason)] <= 0:
            del self.mix[(model, route.profile, route.reason)]
        depths = per_request.depths
        profile = next((p for p in sorted(depths) if depths[p] == depth), CLIENT_PROFILE)
        self.mix[(model, profile, "client")] += 1
        detail = f"the client's own depth {depth}"
        ran_at = route.depth if depth is None else depth
        return replace(route, profile=profile, reason="client", detail=detail, depth=ran_at)

    def _placed(
        self,
        model: str,
        backend: V,
        features: RequestFeatures,
        profile: str,
        reason: Reason,
        detail: str,
    ) -> Route[V]:
        """The bookkeeping of a decision, whichever shape made it: the session's holder, the
        slot cache it takes, the routing mix."""
        key = self.sessions.place(
            backend.name, features.session_key, features.est_prompt_tokens, backend.slots
        )
        self.mix[(model, profile, reason)] += 1
        cls = classify(features, self.settings)
        return Route(backend, profile, reason, detail, cls, backend.in_flight, key)

    def _draws(self, features: RequestFeatures) -> random.Random:
        """The random source of one decision. Seeded: drawn from the seed and the request's own
        content (session key, prompt size), so a request's exploration draws do not depend on
        how many decisions came before it (docs/routing.md, "Exploration"). Unseeded: the
        shared fresh stream."""
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
        if model in self.per_request:
            # Every replica serves every profile; a pin waits for a free slot like any request.
            return None
        ready = any(
            b.profile == profile and b.name not in exclude
            for b in self.backends.ready_of_model(model)
        )
        return profile if ready else None

    def decoding(self, backend: str) -> Mapping[str, int]:
        """The requests decoding on ``backend`` now, by the profile they run at."""
        clock = self.clocks.get(backend)
        return clock.decoding if clock is not None else {}

    def forget_idle_sessions(self) -> int:
        """Drop sessions idle past the TTL (bounded memory); returns how many went."""
        return self.sessions.forget_idle()

    @contextmanager
    def running(self, route: Route[V], *, prefill: bool) -> Iterator[DecodeRun]:
        """The request of ``route`` for as long as it is served: on its process's single-depth
        clock (``prefill``: it streams, and decodes from its first token on) and, admitted
        into its busy epoch, counted there once."""
        name = route.backend.name
        clock = self.clocks.setdefault(name, DepthClock())
        with ExitStack() as stack:
            if route.reason == "busy":
                stack.enter_context(self.busy.admission(name, route.profile))
            yield stack.enter_context(clock.run(route.profile, prefill=prefill))

    def observe(self, outcome: Outcome[V]) -> Observation:
        """A finished request: its observation, learned from as its fate says (``_learning``),
        unless its numbers cannot be true (``plausibility``: then dropped, with the reason)."""
        route, features = outcome.route, outcome.features
        self.sessions.release(route.backend.name, route.cache_key)
        observation = make_observation(
            outcome.usage,
            backend=route.backend.name,
            profile=route.profile,
            request_class=route.request_class,
            sent_at=outcome.sent_at,
            done_at=outcome.done_at,
            spec_delta=outcome.spec_delta,
            clock_scale=self.settings.clock_scale,
        )
        reason = implausible(outcome.usage, observation, route.depth, self.settings)
        if reason is not None:  # nothing learned from it: what was learned before stays
            return dropped(observation, reason)
        if route.reason == "logprobs":  # depth 0 for its logprobs, not as its class's choice
            return observation
        learning = self._learning(outcome, observation)
        fate = self._fate(route, features.model, observation)
        drafts = (observation.draft_n or 0, observation.draft_n_accepted or 0)
        if fate is not Fate.LEARN:
            expected = self._expected_acceptance(route, features.model)
            self.guards.settle(route.backend.name, fate, learning, drafts, expected)
        else:
            learning()
        if self.settings.learning and self._learns_speed(outcome) and observation.context_tokens:
            self.stats.calibrator.observe(features, observation.context_tokens)
        return observation

    def _learns_speed(self, outcome: Outcome[V]) -> bool:
        """Whether the request's speed is its profile's: a per-request depth is learned from
        runs at that depth alone (beside another depth the speed is the mix's, routing.depth),
        and a client's own depth as the profile of that depth, if one has it."""
        route = outcome.route
        return route.depth is None or not (route.profile == CLIENT_PROFILE or outcome.run.mixed)

    def _learning(self, outcome: Outcome[V], observation: Observation) -> Callable[[], None]:
        """What the request teaches, to apply when its fate allows: its busy epoch's speed at
        its depth, and the statistics of its class, profile and load level."""
        route, settings = outcome.route, self.settings
        parts: list[Callable[[], None]] = []
        if route.depth is not None and route.profile != CLIENT_PROFILE:
            speed, output = observation.decode_tok_s or 0.0, observation.output_tokens or 0
            busy = self.busy.sample(
                route.backend.name, route.request_class, route.profile, outcome.run, speed, output
            )
            parts.extend([busy] if busy is not None else [])
        if settings.learning and self._learns_speed(outcome):
            # The load over the request's life: the mean of the others in flight when it was
            # sent and when it ended (its own slot is released by now: in_flight counts others).
            at_end = outcome.others_at_end
            at_end = route.backend.in_flight if at_end is None else at_end
            load = (route.in_flight + at_end) / 2.0
            # One process keys its statistics by load level (this request counted).
            level = load_level(load + 1.0, settings) if route.depth is not None else 0
            stats = functools.partial(
                self.stats.observe,
                route.request_class,
                route.profile,
                observation,
                model=outcome.features.model,
                load=load,
                level=level,
            )
            parts.append(stats)

        def learn() -> None:
            for part in parts:
                part()

        return learn

    def _fate(self, route: Route[V], model: str, observation: Observation) -> Fate:
        """What the collapse guard makes of a finished request (routing.collapse_guards)."""
        drafted, accepted = observation.draft_n, observation.draft_n_accepted
        if route.depth is None or not self.settings.collapse_guard:
            return Fate.LEARN
        if not drafted or accepted is None:
            return Fate.LEARN
        expected = self._expected_acceptance(route, model)
        trial = route.reason == "collapsed"
        name = route.backend.name
        return self.guards.fate(
            name, model, (drafted, accepted), expected, self.clock(), trial=trial
        )

    def _expected_acceptance(self, route: Route[V], model: str) -> float:
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
                request_class=f"{row['bucket']}/{row['kind']}",
                load_level=str(row["level"] or LEVEL_ANY),
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
        # The class and its load level apart, as the metrics label them; "class" keeps both
        # in one word ("<4k/code@2"), the form tune and the learned file speak.
        learned = [
            {
                **row,
                "request_class": f"{row['bucket']}/{row['kind']}",
                "load_level": str(row["level"] or LEVEL_ANY),
            }
            for row in self.stats.table()
        ]
        return {
            "mix": mix,
            "learned": learned,
            "sessions": len(self.sessions),
            "busy": {name: busy.report() for name, busy in sorted(self.stats.busy.items())},
            "calibration": {
                name: c.report(self.settings.concurrency_levels)
                for name, c in sorted(self.calibrated.items())
            },
            "collapse": self.guards.report(self.clock()),
            "changes": list(self.stats.changes),
            "state": self.stats.load_report,
        }


def _load_words(level: int, others: int, recent_load: float) -> str:
    """What placed a request above load level 1, for its detail: the requests in flight beside
    it, or the recent admissions' load where that is higher (a request sent alone right after
    others is counted busy: it is likely to have company, routing.depth)."""
    if level <= 1:
        return ""
    s = "" if others == 1 else "s"
    return (
        f" (load level {level}: {others} other request{s} in flight, "
        f"{recent_load:.1f} decoding at recent admissions)"
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")

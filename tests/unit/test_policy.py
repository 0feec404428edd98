"""The routing policy: pinning, cold rules and guard, learned goodput, load and spill,
prefix-cache affinity, bounded exploration. Plain values in, decisions out."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass, classify_tokens
from proxy.routing.features import ContentKind, RequestFeatures
from proxy.routing.policy import Candidate, Decision, decide
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation
from tests.support.routing_inputs import Draws, feat

S = RoutingSettings()
NO_EXPLORE = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)


def pool(
    *,
    off: int = 0,
    min_: int = 0,
    max_: int = 0,
    slots: int = 4,
    holder: str | None = None,
) -> list[Candidate]:
    """One backend per profile with the given in-flight counts."""
    return [
        Candidate(f"b-{p}", p, True, n, slots, holds_session=holder == p)
        for p, n in (("off", off), ("min", min_), ("max", max_))
    ]


def train(
    stats: LearnedStats,
    cls: RequestClass,
    profile: str,
    decode: float,
    *,
    n: int = 10,
    acceptance: float | None = 0.8,
    prefill_tok_s: float = 1000.0,
    out: int = 400,
    load: float = 0.0,
) -> None:
    drafted = 100 if profile != "off" and acceptance is not None else 0
    for _ in range(n):
        obs = Observation(
            backend=f"b-{profile}",
            profile=profile,
            request_class=cls,
            context_tokens=2000,
            cached_tokens=0,
            output_tokens=out,
            draft_n=drafted,
            draft_n_accepted=int(drafted * (acceptance or 0)),
            decode_tok_s=decode,
            prefill_s=2000 / prefill_tok_s,
            ttft_s=None,
            total_s=None,
            source="timings",
        )
        stats.observe(cls, profile, obs, load=load)


def run(
    f: RequestFeatures,
    cands: list[Candidate],
    stats: LearnedStats | None = None,
    settings: RoutingSettings = NO_EXPLORE,
    rng: random.Random | None = None,
) -> Decision:
    d = decide(f, cands, stats or LearnedStats(settings), settings, rng or random.Random(0))
    assert d is not None
    return d


def cls_of(tokens: int, kind: ContentKind = "prose", settings: RoutingSettings = S) -> RequestClass:
    return classify_tokens(tokens, kind, settings)


# --- availability, pinning -----------------------------------------------------------------


def test_no_ready_backend_means_none() -> None:
    stats = LearnedStats(S)
    assert decide(feat(), [], stats, S, random.Random(0)) is None
    down = [Candidate("b", "max", False, 0, 4), Candidate("c", "off", False, 0, 4)]
    assert decide(feat(), down, stats, S, random.Random(0)) is None


@pytest.mark.parametrize(("pin", "profile"), [("off", "off"), ("min", "min"), ("MAX", "max")])
def test_pin_roles(pin: str, profile: str) -> None:
    d = run(feat(100_000, "code", pin=pin), pool())
    assert (d.profile, d.reason) == (profile, "pinned")


def test_pin_custom_name_maps_roles_and_prefers_holder() -> None:
    settings = RoutingSettings(profile_max="turbo", exploration_rate=0, cold_exploration_rate=0)
    cands = [
        Candidate("t1", "turbo", True, 0, 4),
        Candidate("t2", "turbo", True, 3, 4, holds_session=True),
        Candidate("o", "off", True, 0, 4),
    ]
    d = run(feat(pin="max"), cands, settings=settings)
    assert (d.backend, d.reason) == ("t2", "pinned")
    assert run(feat(pin="turbo"), cands, settings=settings).backend == "t2"


def test_pin_to_missing_profile_falls_through() -> None:
    d = run(feat(pin="nope"), pool())
    assert d.reason == "rule"
    assert d.profile == "max"
    assert "pin nope unavailable" in d.detail


# --- cold rules and guard --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "kind", "agentic", "profile"),
    [
        (500, "prose", False, "max"),  # short chat
        (3000, "code", False, "max"),  # short code edit
        (40_000, "code", False, "min"),  # long-context code
        (40_000, "prose", False, "off"),  # long prose
        (2000, "code", True, "min"),  # a new agent session is placed for what it becomes
    ],
)
def test_cold_rules(tokens: int, kind: ContentKind, agentic: bool, profile: str) -> None:
    d = run(feat(tokens, kind, agentic=agentic), pool())
    assert (d.profile, d.reason) == (profile, "rule")


def test_agent_horizon_can_be_disabled() -> None:
    settings = RoutingSettings(agent_horizon_tokens=0, exploration_rate=0, cold_exploration_rate=0)
    assert run(feat(2000, "code", agentic=True), pool(), settings=settings).profile == "max"


def test_fallback_when_the_rule_profile_is_missing() -> None:
    cands = [c for c in pool() if c.profile != "max"]
    d = run(feat(), cands)
    assert (d.profile, d.reason) == ("min", "fallback")
    assert "max not ready" in d.detail
    odd = [Candidate("x", "experimental", True, 0, 2)]
    d = run(feat(), odd)
    assert (d.backend, d.reason) == ("x", "fallback")


def test_break_even_guard() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    # Decode speeds unknown (tiny outputs), acceptance known: max drafts badly here.
    train(stats, cls, "max", 50.0, acceptance=0.3, out=2)
    d = run(feat(), pool(), stats)
    assert (d.profile, d.reason) == ("min", "rule")
    assert "max below break-even" in d.detail
    train(stats, cls, "min", 50.0, acceptance=0.45, out=2)
    assert run(feat(), pool(), stats).profile == "off"
    # a trusted acceptance above break-even does not trigger the guard
    other = cls_of(500, "code")
    train(stats, other, "max", 50.0, acceptance=0.6, out=2)
    assert run(feat(500, "code"), pool(), stats).profile == "max"


# --- learned goodput and load ------------------------------------------------------------------


def test_learned_picks_best_goodput() -> None:
    # Slow drift, followed by the decay alone (change detection would reset the class instead:
    # tests/unit/test_stats.py)
    stats = LearnedStats(NO_EXPLORE.model_copy(update={"change_detection": False}))
    cls = cls_of(40_000, "code")
    train(stats, cls, "off", 38.0)
    train(stats, cls, "min", 40.0)
    train(stats, cls, "max", 33.0)
    d = run(feat(40_000, "code"), pool(), stats)
    assert (d.profile, d.reason) == ("min", "learned")
    assert "40.0" in d.detail
    train(stats, cls, "min", 20.0, n=200)  # drift: min got slow in this class
    assert run(feat(40_000, "code"), pool(), stats).profile == "off"


def test_learned_needs_two_trusted_profiles() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    train(stats, cls, "off", 80.0)  # only one trusted profile: still the cold rule
    assert run(feat(), pool(), stats).reason == "rule"
    train(stats, cls, "max", 60.0, n=3)  # below min_samples
    assert run(feat(), pool(), stats).reason == "rule"


def test_in_flight_discounts_speculative_profiles() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    train(stats, cls, "off", 38.0)
    train(stats, cls, "max", 55.0)
    assert run(feat(), pool(), stats).profile == "max"
    d = run(feat(), pool(max_=3), stats)  # not full, but speculation gains shrink
    assert (d.profile, d.reason) == ("off", "learned")
    assert "load favours off over max" in d.detail


def test_speeds_learned_under_load_are_not_discounted_twice() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    train(stats, cls, "off", 38.0)
    # max was measured at 55 tok/s while two other requests ran on it: alone it is faster,
    # and at that same load it is still 55, well ahead of an idle off.
    train(stats, cls, "max", 55.0, load=2.0)
    assert stats.view(cls)["max"].decode_load == pytest.approx(2.0)
    d = run(feat(), pool(max_=2), stats)
    assert (d.profile, d.reason) == ("max", "learned")
    # Measured idle, the same 55 at two in flight would be ~33 tok/s: off wins.
    fresh = LearnedStats(NO_EXPLORE)
    train(fresh, cls, "off", 38.0)
    train(fresh, cls, "max", 55.0)
    assert run(feat(), pool(max_=2), fresh).profile == "off"


def test_spill_when_chosen_backend_is_full_cold() -> None:
    d = run(feat(), pool(max_=4))
    assert (d.profile, d.reason) == ("min", "spill")
    assert "max busy" in d.detail
    d = run(feat(), pool(off=4, min_=4, max_=4))
    assert (d.profile, d.reason) == ("max", "rule")
    assert "all busy, queued" in d.detail


def test_spill_when_chosen_backend_is_full_learned() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    train(stats, cls, "off", 38.0)
    train(stats, cls, "max", 55.0)
    d = run(feat(), pool(max_=4), stats)
    assert (d.profile, d.reason) == ("off", "spill")


def test_replica_of_same_profile_before_spilling() -> None:
    cands = [*pool(max_=4), Candidate("b-max-2", "max", True, 1, 4)]
    d = run(feat(), cands)
    assert (d.backend, d.reason) == ("b-max-2", "rule")


def test_spill_threshold_below_one() -> None:
    settings = RoutingSettings(spill_threshold=0.5, exploration_rate=0, cold_exploration_rate=0)
    # busy at 2/4: no queue yet, but the load-discounted max loses to an idle min
    d = run(feat(), pool(max_=2), settings=settings)
    assert (d.profile, d.reason) == ("min", "spill")
    assert run(feat(), pool(max_=1), settings=settings).profile == "max"
    # every other profile busy too: stay
    d = run(feat(), pool(off=2, min_=2, max_=2), settings=settings)
    assert (d.profile, d.reason) == ("max", "rule")


# --- affinity -------------------------------------------------------------------------------


def test_affinity_keeps_a_long_session_on_its_cache() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(100_000, "code")
    train(stats, cls, "off", 38.0)
    train(stats, cls, "max", 32.0)  # max is slower here, but re-prefill costs 100 s
    d = run(feat(100_000, "code"), pool(holder="max"), stats)
    assert (d.backend, d.reason) == ("b-max", "affinity")


def test_affinity_broken_when_gain_beats_reprefill() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(1000)
    train(stats, cls, "off", 40.0)
    train(stats, cls, "max", 20.0)
    d = run(feat(1000), pool(holder="max"), stats)
    assert (d.profile, d.reason) == ("off", "learned")
    assert "left b-max" in d.detail


def test_affinity_without_learned_stats_stays() -> None:
    d = run(feat(1000), pool(holder="off"))
    assert (d.backend, d.reason) == ("b-off", "affinity")


def test_busy_holder_long_context_queues_rather_than_reprefill() -> None:
    d = run(feat(100_000, "code"), pool(holder="min", min_=4))
    assert (d.backend, d.reason) == ("b-min", "affinity")


def test_busy_holder_short_context_spills() -> None:
    d = run(feat(500), pool(holder="max", max_=12))
    assert d.reason == "spill"
    assert d.backend != "b-max"


def test_affinity_overrides_agent_projection() -> None:
    d = run(feat(2000, "code", agentic=True), pool(holder="max"))
    assert (d.profile, d.reason) == ("max", "affinity")


# --- exploration ------------------------------------------------------------------------------


def _mix(
    f: RequestFeatures,
    cands: list[Candidate],
    stats: LearnedStats,
    settings: RoutingSettings,
    n: int = 4000,
) -> Counter[tuple[str, str]]:
    rng = random.Random(42)
    out: Counter[tuple[str, str]] = Counter()
    for _ in range(n):
        d = decide(f, cands, stats, settings, rng)
        assert d is not None
        out[(d.reason, d.profile)] += 1
    return out


def test_exploration_rate_is_bounded_and_tries_untried_first() -> None:
    settings = RoutingSettings(exploration_rate=0.05)
    stats = LearnedStats(settings)
    cls = cls_of(500)
    train(stats, cls, "off", 38.0)
    train(stats, cls, "max", 60.0)
    mix = _mix(feat(), pool(), stats, settings)
    explored = sum(v for (reason, _), v in mix.items() if reason == "explore")
    assert 0.03 * 4000 < explored <= 0.05 * 4000 + 3 * (4000 * 0.05 * 0.95) ** 0.5
    assert mix[("explore", "min")] == explored  # the untried profile, never the known-worse
    assert mix[("learned", "max")] == 4000 - explored


def test_no_exploration_at_rate_zero_with_holder_or_huge_prompt() -> None:
    stats = LearnedStats(S)
    assert _mix(feat(), pool(), stats, NO_EXPLORE, 500).keys() == {("rule", "max")}
    assert _mix(feat(), pool(holder="max"), stats, S, 500).keys() == {("affinity", "max")}
    huge = feat(S.exploration_max_tokens, "code")
    assert _mix(huge, pool(), stats, S, 500).keys() == {("rule", "min")}


def test_never_explores_known_much_worse_on_long_context() -> None:
    settings = RoutingSettings(exploration_rate=0.2, exploration_max_tokens=65536)
    stats = LearnedStats(settings)
    cls = cls_of(40_000, "code")
    train(stats, cls, "off", 40.0)
    train(stats, cls, "min", 38.0)
    train(stats, cls, "max", 15.0)  # far worse: a wrong pick here costs a lot
    mix = _mix(feat(40_000, "code"), pool(), stats, settings, 2000)
    assert ("explore", "max") not in mix
    assert sum(v for (r, _), v in mix.items() if r == "explore") <= 0.2 * 2000 + 60
    # on short prompts the same known-worse profile may still be explored
    short = cls_of(500)
    train(stats, short, "off", 40.0)
    train(stats, short, "min", 38.0)
    train(stats, short, "max", 30.0, n=6)
    settings_loose = RoutingSettings(exploration_rate=0.2)
    assert any(r == "explore" for r, _ in _mix(feat(), pool(), stats, settings_loose, 2000))


def test_long_context_guarded_profile_not_explored() -> None:
    settings = RoutingSettings(exploration_rate=0.2, exploration_max_tokens=65536)
    stats = LearnedStats(settings)
    cls = cls_of(40_000, "code")
    train(stats, cls, "max", 50.0, acceptance=0.2, out=2)  # acceptance known, speed not
    mix = _mix(feat(40_000, "code"), pool(), stats, settings, 1000)
    assert ("explore", "max") not in mix
    assert mix[("explore", "off")] > 0


def test_thompson_rarely_explores_well_separated_profiles() -> None:
    settings = RoutingSettings(exploration_rate=0.2)
    stats = LearnedStats(settings)
    cls = cls_of(500)
    train(stats, cls, "off", 30.0, n=50)
    train(stats, cls, "min", 40.0, n=50)
    train(stats, cls, "max", 60.0, n=50)
    mix = _mix(feat(), pool(), stats, settings, 2000)
    assert sum(v for (r, _), v in mix.items() if r == "explore") < 10
    # close estimates: Thompson does explore, still within the cap
    close = cls_of(500, "code")
    for p, speed in (("off", 40.0), ("min", 40.5), ("max", 41.0)):
        train(stats, close, p, speed, n=6)
    mix = _mix(feat(500, "code"), pool(), stats, settings, 2000)
    explored = sum(v for (r, _), v in mix.items() if r == "explore")
    assert 0 < explored <= 0.2 * 2000 + 60


def test_exploration_gate_uses_the_passed_draws() -> None:
    settings = RoutingSettings(exploration_rate=0.05)
    stats = LearnedStats(settings)
    train(stats, cls_of(500), "off", 38.0)
    train(stats, cls_of(500), "max", 39.0)
    d = decide(feat(), pool(), stats, settings, Draws(0.01))
    assert d is not None and d.reason == "explore"
    d = decide(feat(), pool(), stats, settings, Draws(0.06))
    assert d is not None and d.reason == "learned"


def test_decisions_are_deterministic_for_a_seed() -> None:
    settings = RoutingSettings(exploration_rate=0.2)
    stats = LearnedStats(settings)
    cls = cls_of(500)
    for p, speed in (("off", 40.0), ("min", 41.0), ("max", 42.0)):
        train(stats, cls, p, speed, n=6)

    def seq(seed: int) -> list[Decision | None]:
        rng = random.Random(seed)
        return [decide(feat(), pool(), stats, settings, rng) for _ in range(300)]

    assert seq(3) == seq(3)


def test_per_model_stats_view() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    for model, fast in (("a", "max"), ("b", "off")):
        for p in ("off", "max"):
            for _ in range(6):
                speed = 60.0 if p == fast else 30.0
                obs = Observation(
                    f"b-{p}", p, cls, 600, 0, 300, 0, 0, speed, 0.5, None, None, "timings"
                )
                stats.observe(cls, p, obs, model=model)
    rng = random.Random(0)
    da = decide(feat(), pool(), stats.for_model("a"), NO_EXPLORE, rng)
    db = decide(feat(), pool(), stats.for_model("b"), NO_EXPLORE, rng)
    assert da is not None and db is not None
    assert (da.profile, da.reason) == ("max", "learned")
    assert (db.profile, db.reason) == ("off", "learned")


# --- learning off, borrowed rankings, cache-aware placement -----------------------------------


def test_learning_off_is_the_cold_rules_only() -> None:
    settings = RoutingSettings(learning=False, exploration_rate=0.2)
    stats = LearnedStats(settings)
    assert _mix(feat(), pool(), stats, settings, 500).keys() == {("rule", "max")}


def test_new_agent_sessions_and_long_prompts_are_not_explored() -> None:
    settings = RoutingSettings(exploration_rate=0.2)
    stats = LearnedStats(settings)
    agent = _mix(feat(2000, "code", agentic=True), pool(), stats, settings, 500)
    assert agent.keys() == {("rule", "min")}  # planned at 32k tokens: a wrong pick is sticky
    assert _mix(feat(40_000, "prose"), pool(), stats, settings, 500).keys() == {("rule", "off")}
    assert any(r == "explore" for r, _ in _mix(feat(), pool(), stats, settings, 500))


def test_an_unlearned_class_borrows_its_neighbours_ranking() -> None:
    stats = LearnedStats(NO_EXPLORE)
    train(stats, cls_of(500, "prose"), "off", 38.0)
    train(stats, cls_of(500, "prose"), "max", 20.0)  # max is slow on this GPU
    d = run(feat(500, "code"), pool(), stats)
    assert (d.profile, d.reason) == ("off", "learned")
    assert "(from <4k/prose)" in d.detail
    # the class's own trusted estimates win over the borrowed ones
    train(stats, cls_of(500, "code"), "off", 10.0)
    d = run(feat(500, "code"), pool(), stats)
    assert (d.profile, d.reason) == ("max", "learned")
    # a neighbouring bucket lends too; far buckets do not
    assert run(feat(6000, "prose"), pool(), stats).detail.endswith("tok/s")
    assert run(feat(20_000, "prose"), pool(), stats).reason == "rule"


def test_cold_placement_spares_a_long_cached_prompt() -> None:
    def cands(evicts: int) -> list[Candidate]:
        return [
            Candidate("b-off", "off", True, 0, 4),
            Candidate("b-min", "min", True, 0, 4),
            Candidate("b-max", "max", True, 0, 4, evicts_tokens=evicts),
        ]

    d = run(feat(500), cands(80_000))  # the rule's max would overwrite an agent's cache
    assert d.reason == "spill" and d.profile != "max"
    assert "spare 80000 cached tokens on b-max" in d.detail
    assert run(feat(500), cands(300)).profile == "max"  # a cheap victim is overwritten


def test_new_agent_sessions_are_spread_over_the_long_code_profiles() -> None:
    def cands(min_resident: int, off_resident: int = 0) -> list[Candidate]:
        return [
            Candidate("b-off", "off", True, 0, 4, resident=off_resident),
            Candidate("b-min", "min", True, 0, 4, resident=min_resident),
            Candidate("b-max", "max", True, 0, 4),
        ]

    agent = feat(9000, "code", agentic=True)
    assert run(agent, cands(0)).profile == "min"  # the cold rule
    d = run(agent, cands(1))  # another agent lives on min: this one goes to off
    assert (d.profile, d.reason) == ("off", "rule")
    assert "spread: 1 long sessions on b-min" in d.detail
    assert run(agent, cands(1, 1)).profile == "min"  # as loaded: the rule's pick
    assert run(agent, cands(2, 1)).profile == "off"
    # A one-off long prompt (not a session that will stay) is not spread.
    assert run(feat(40_000, "code"), cands(2)).profile == "min"


def test_learned_placement_of_an_agent_counts_resident_sessions_as_load() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(40_000, "code")
    train(stats, cls, "off", 30.0)
    train(stats, cls, "min", 36.0)
    train(stats, cls, "max", 20.0)
    resident = [
        Candidate("b-off", "off", True, 0, 4),
        Candidate("b-min", "min", True, 0, 4, resident=2),
        Candidate("b-max", "max", True, 0, 4),
    ]
    assert run(feat(40_000, "code"), resident, stats).profile == "min"  # a one-off request
    assert run(feat(40_000, "code", agentic=True), resident, stats).profile == "off"


def test_learned_placement_counts_the_cache_it_overwrites() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(500)
    train(stats, cls, "min", 55.0)
    train(stats, cls, "max", 60.0)
    assert run(feat(), pool(), stats).profile == "max"
    cands = [*pool()[:2], Candidate("b-max", "max", True, 0, 4, evicts_tokens=100_000)]
    d = run(feat(), cands, stats)
    assert (d.profile, d.reason) == ("min", "learned")


def test_replicas_prefer_the_one_that_overwrites_nothing() -> None:
    cands = [
        Candidate("max-1", "max", True, 0, 4, evicts_tokens=50_000),
        Candidate("max-2", "max", True, 0, 4),
    ]
    assert run(feat(pin="max"), cands).backend == "max-2"


def test_affinity_leaves_an_unproven_holder_for_a_trusted_better_profile() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(1000)
    train(stats, cls, "off", 30.0, n=2)  # explored once or twice: not trusted yet
    train(stats, cls, "max", 60.0)
    train(stats, cls, "min", 50.0)
    d = run(feat(1000), pool(holder="off"), stats)
    assert (d.profile, d.reason) == ("max", "learned")
    assert "left b-off" in d.detail


def test_a_huge_max_tokens_does_not_overflow_the_goodput_maths() -> None:
    stats = LearnedStats(NO_EXPLORE)
    cls = cls_of(40_000, "code")
    for profile, speed in (("off", 38.0), ("min", 40.0), ("max", 33.0)):
        train(stats, cls, profile, speed)
    d = run(feat(40_000, "code", max_tokens=10**400), pool(), stats)
    assert (d.profile, d.reason) == ("min", "learned")

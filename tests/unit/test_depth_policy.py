"""The routing policy of one process (routing.depth): replica, pin, the busy epoch's depth,
learned per load level, cold rules, break-even guard, bounded exploration. Plain values in."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from proxy.config.routing import RoutingSettings
from proxy.routing.choice import rising_line, trend_estimates
from proxy.routing.classes import RequestClass, load_level
from proxy.routing.depth import DepthDecision, Replica, decide_depth
from proxy.routing.features import ContentKind
from proxy.routing.stats import Estimate, LearnedStats
from proxy.routing.telemetry import Observation
from tests.support.routing_inputs import Draws, feat

S = RoutingSettings()
NO_EXPLORE = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
DEPTHS = {"off": 0, "min": 2, "max": 3}
SHORT = RequestClass("<4k", "prose")


def one(in_flight: int = 0, **kw: object) -> Replica:
    return Replica("m/one-process", True, in_flight, 4, **kw)


def train(
    stats: LearnedStats,
    cls: RequestClass,
    profile: str,
    decode: float,
    *,
    level: int = 1,
    n: int = 10,
    acceptance: float = 0.8,
    out: int = 400,
    context: int = 2000,
) -> None:
    drafted = 100 if DEPTHS[profile] else 0
    for _ in range(n):
        obs = Observation(
            backend="m/one-process",
            profile=profile,
            request_class=cls,
            context_tokens=context,
            cached_tokens=0,
            output_tokens=out,
            draft_n=drafted or None,
            draft_n_accepted=int(drafted * acceptance) if drafted else None,
            decode_tok_s=decode,
            prefill_s=2.0,
            ttft_s=None,
            total_s=None,
            source="timings",
        )
        stats.observe(cls, profile, obs, level=level)


def run(
    tokens: int = 500,
    kind: ContentKind = "prose",
    replicas: list[Replica] | None = None,
    stats: LearnedStats | None = None,
    settings: RoutingSettings = NO_EXPLORE,
    *,
    pin: str | None = None,
    mixed: bool = False,
    rng: random.Random | None = None,
) -> DepthDecision:
    d = decide_depth(
        feat(tokens, kind, pin=pin),
        replicas or [one()],
        DEPTHS,
        (stats or LearnedStats(settings)).for_model(""),
        settings,
        rng or random.Random(0),
        mixed=mixed,
    )
    assert d is not None
    return d


def test_levels_keep_alone_two_and_four_plus_apart() -> None:
    assert [load_level(n, S) for n in (1, 2, 3, 4, 9)] == [1, 2, 2, 4, 4]


def test_no_ready_replica_is_no_decision() -> None:
    down = Replica("m/one-process", False, 0, 4)
    assert decide_depth(feat(), [down], DEPTHS, LearnedStats(S).for_model(""), S, Draws()) is None


def test_cold_alone_follows_the_design_card_rules() -> None:
    assert (run(500).profile, run(500).depth, run(500).reason) == ("max", 3, "rule")
    assert run(40_000, "code").profile == "min"
    assert run(40_000, "prose").profile == "off"


def test_cold_beside_others_does_not_draft() -> None:
    # Published runs: MTP -19 % to -30 % at 2-4 parallel requests. Mixed allowed, so the
    # newcomer is free to choose; what decodes there sets its load level.
    d = run(500, replicas=[one(1)], mixed=True)
    assert (d.profile, d.depth, d.level, d.reason) == ("off", 0, 2, "rule")


def test_beside_others_a_request_gets_the_depth_of_the_busy_epoch() -> None:
    d = run(500, "prose", replicas=[one(2, busy_depth="max")])
    assert (d.profile, d.depth, d.reason, d.level) == ("max", 3, "busy", 2)
    assert d.detail == "busy epoch of m/one-process at max"
    # A model whose slots may mix depths chooses per request instead.
    free = run(500, "prose", replicas=[one(2, busy_depth="max")], mixed=True)
    assert (free.profile, free.reason) == ("off", "rule")


def test_a_recent_burst_counts_as_busy_and_an_idle_process_lets_the_request_choose() -> None:
    burst = run(500, replicas=[one(0, recent_load=4.2, busy_depth="off")])
    assert (burst.profile, burst.reason, burst.level) == ("off", "busy", 4)
    idle = run(500, replicas=[one(0, busy_depth="off")])
    assert (idle.profile, idle.reason, idle.level) == ("max", "rule", 1)


def test_a_pin_wins_over_the_busy_epoch() -> None:
    d = run(500, replicas=[one(2, busy_depth="max")], pin="off")
    assert (d.profile, d.depth, d.reason) == ("off", 0, "pinned")
    assert run(500, pin="MIN").depth == 2


def test_an_unknown_pin_is_said_and_ignored() -> None:
    d = run(500, pin="turbo")
    assert d.profile == "max" and d.detail.startswith("pin turbo unknown")


def test_learned_at_the_load_level_it_runs_at() -> None:
    stats = LearnedStats(NO_EXPLORE)
    for profile, alone, busy in (("off", 30.0, 25.0), ("min", 40.0, 22.0), ("max", 50.0, 20.0)):
        train(stats, SHORT, profile, alone, level=1)
        train(stats, SHORT, profile, busy, level=2)
    alone_pick = run(500, stats=stats)
    assert (alone_pick.profile, alone_pick.reason, alone_pick.level) == ("max", "learned", 1)
    busy_pick = run(500, replicas=[one(1)], stats=stats, mixed=True)
    assert (busy_pick.profile, busy_pick.reason, busy_pick.level) == ("off", "learned", 2)


def test_an_idle_process_with_a_busy_recent_past_plans_for_the_burst() -> None:
    stats = LearnedStats(NO_EXPLORE)
    for profile, alone, busy in (("off", 30.0, 25.0), ("min", 40.0, 22.0), ("max", 50.0, 20.0)):
        train(stats, SHORT, profile, alone, level=1)
        train(stats, SHORT, profile, busy, level=4)
    d = run(500, replicas=[one(0, recent_load=4.2)], stats=stats)
    assert (d.profile, d.level) == ("off", 4)


def test_a_class_short_of_data_borrows_its_neighbours_ranking_at_the_same_level() -> None:
    stats = LearnedStats(NO_EXPLORE)
    code = RequestClass("<4k", "code")
    for profile, speed in (("off", 30.0), ("min", 45.0), ("max", 40.0)):
        train(stats, code, profile, speed)
    d = run(500, "prose", stats=stats)
    assert (d.profile, d.reason) == ("min", "learned")
    assert "(from <4k/code)" in d.detail


def test_break_even_guard_skips_a_depth_that_accepts_too_little() -> None:
    stats = LearnedStats(NO_EXPLORE)
    train(stats, SHORT, "max", 31.0, acceptance=0.3)  # trusted alone is not enough to learn
    d = run(500, stats=stats)
    assert (d.profile, d.reason) == ("min", "rule")
    assert "max below break-even" in d.detail


def test_exploration_is_bounded_and_tries_the_untried_first() -> None:
    settings = RoutingSettings(exploration_rate=0.05, cold_exploration_rate=0.5)
    explored = run(500, settings=settings, rng=Draws(0.1))
    assert explored.reason == "explore" and explored.profile in ("off", "min")
    kept = run(500, settings=settings, rng=Draws(0.9))
    assert kept.reason == "rule"
    # Long prompts explore too: every depth shares the process's cache, so a depth tried on a
    # long prompt costs that request's decode only (a pool keeps exploration_max_tokens).
    assert run(40_000, "code", settings=settings, rng=Draws(0.0)).reason == "explore"
    # Without learning: no exploration at all.
    frozen = RoutingSettings(learning=False, cold_exploration_rate=1.0)
    assert run(500, settings=frozen, rng=Draws(0.0)).reason == "rule"


def test_learned_exploration_rate_stays_small() -> None:
    stats = LearnedStats(S)
    for profile, speed in (("off", 30.0), ("min", 40.0), ("max", 50.0)):
        train(stats, SHORT, profile, speed, n=50)
    rng = random.Random(7)
    reasons = Counter(run(500, stats=stats, settings=S, rng=rng).reason for _ in range(2000))
    assert reasons["explore"] <= 0.05 * 2000
    assert reasons["learned"] >= 0.95 * 2000


def test_the_session_holder_keeps_its_request_while_it_has_room() -> None:
    a = Replica("m/one-process#1", True, 2, 4)
    b = Replica("m/one-process#2", True, 0, 4, holds_session=True)
    c = Replica("m/one-process#3", True, 0, 4)
    assert run(500, replicas=[a, c, b]).backend == "m/one-process#2"
    full = Replica("m/one-process#2", True, 4, 4, holds_session=True)
    assert run(500, replicas=[a, full, c]).backend == "m/one-process#3"
    assert run(500, replicas=[a, c]).backend == "m/one-process#3"  # least loaded


def test_long_contexts_never_explore_a_depth_known_to_lose_much() -> None:
    # Exploration allowed on long prompts here, to see the regret bound alone; long answers,
    # so the decode speed dominates the expected time.
    settings = RoutingSettings(exploration_rate=0.2, exploration_max_tokens=100_000, min_samples=2)
    stats = LearnedStats(settings)
    long_code = RequestClass("32k-64k", "code")
    for profile, speed in (("off", 30.0), ("min", 29.0)):
        train(stats, long_code, profile, speed, n=20, out=4000)
    for speed in (1.0, 39.0):  # max: 20 tok/s on average, so uncertain Thompson may pick it
        train(stats, long_code, "max", speed, n=1, out=4000)
    picks = Counter(
        run(40_000, "code", stats=stats, settings=settings, rng=random.Random(seed)).profile
        for seed in range(300)
    )
    assert picks["max"] == 0 and picks["min"] > 0, picks  # min is explored, max never


def test_long_contexts_never_explore_a_depth_below_break_even() -> None:
    settings = RoutingSettings(exploration_rate=0.2, exploration_max_tokens=100_000)
    stats = LearnedStats(settings)
    long_code = RequestClass("32k-64k", "code")
    train(stats, long_code, "off", 30.0, n=20)
    train(stats, long_code, "min", 29.0, n=20)
    train(stats, long_code, "max", 29.5, n=20, acceptance=0.3)  # fast enough, accepts too little
    picks = Counter(
        run(40_000, "code", stats=stats, settings=settings, rng=random.Random(seed)).profile
        for seed in range(300)
    )
    assert picks["max"] == 0 and picks["min"] > 0, picks


def test_a_longer_class_follows_the_context_trend_of_its_kind() -> None:
    """A session growing past 64k tokens: the shorter buckets say drafting's lead shrinks with
    context (setup-b's code: max 1.45x off at 10k, 1.33x at 24k, 1.12x at 48k), so the first
    request past 64k starts at off, where their own level (max ahead) would have kept max."""
    stats = LearnedStats(NO_EXPLORE)
    for bucket, context, off, max_ in (
        ("4k-16k", 10_000, 36.0, 52.0),
        ("16k-32k", 24_000, 34.0, 45.0),
        ("32k-64k", 48_000, 32.0, 36.0),
    ):
        cls = RequestClass(bucket, "code")
        train(stats, cls, "off", off, n=3, context=context)
        train(stats, cls, "max", max_, n=3, context=context)
    far = run(90_000, "code", stats=stats)
    assert (far.profile, far.reason) == ("off", "learned") and "context trend" in far.detail
    near = run(52_000, "code", stats=stats)
    assert near.profile == "max"  # the crossover is later: at 52k drafting still leads
    prose = run(90_000, "prose", stats=stats)
    assert prose.reason == "rule"  # another kind: its own trend, none yet


def test_the_time_per_token_never_falls_with_context_and_needs_a_span() -> None:
    assert rising_line([(10_000.0, 0.03, 1.0), (40_000.0, 0.02, 1.0)]) == (0.025, 0.0)
    assert rising_line([(10_000.0, 0.03, 1.0), (12_000.0, 0.04, 1.0)]) is None
    a, b = rising_line([(0.0, 0.02, 1.0), (10_000.0, 0.03, 3.0)]) or (0.0, 0.0)
    assert (a, b) == pytest.approx((0.02, 1e-6))


def test_the_calibration_gives_each_kind_its_first_trend_point_alone() -> None:
    """One bucket measured: no line yet. The start-up calibration's short code prompt, alone at
    depth 0 and at the deepest depth, is the second point of each line."""
    stats = LearnedStats(NO_EXPLORE)
    cls = RequestClass("4k-16k", "code")
    train(stats, cls, "off", 36.0, n=3, context=10_000)
    train(stats, cls, "max", 52.0, n=3, context=10_000)
    assert run(90_000, "code", stats=stats).reason == "rule"
    points = {"code": {"off": (100.0, 37.6), "max": (100.0, 59.0)}}
    calibrated = Replica("m/one-process", True, 0, 4, alone_points=points)
    d = run(90_000, "code", stats=stats, replicas=[calibrated])
    assert d.reason == "learned" and "context trend" in d.detail
    busy = Replica("m/one-process", True, 0, 4, recent_load=2.0, alone_points=points)
    assert run(90_000, "code", stats=stats, replicas=[busy], mixed=True).reason == "rule"


def test_recent_requests_draw_the_line_where_they_suffice() -> None:
    """A session growing turn by turn: its last requests, a few thousand tokens below the next
    one, draw the line; bucket means (the middle of each bucket) only where they are too few."""
    stats = LearnedStats(S)
    for bucket, context, speed in (("4k-16k", 10_000, 50.0), ("32k-64k", 40_000, 40.0)):
        train(stats, RequestClass(bucket, "code"), "max", speed, n=5, context=context)
        train(stats, RequestClass(bucket, "code"), "off", 30.0, n=5, context=context)
    view = stats.for_model("")

    def view_of(c: RequestClass) -> dict[str, Estimate]:
        return view.view_at(c, 1)

    cls = RequestClass("64k+", "code")
    by_buckets = trend_estimates(view_of, cls, DEPTHS, S, 70_000)
    steep = [(50_000.0 + 4_000 * i, 36.0 - 3.0 * i) for i in range(4)]  # falling fast lately
    local = trend_estimates(view_of, cls, DEPTHS, S, 70_000, recent={"max": steep})
    few = trend_estimates(view_of, cls, DEPTHS, S, 70_000, recent={"max": steep[:3]})
    assert by_buckets["max"].decode_tok_s == few["max"].decode_tok_s
    assert local["max"].decode_tok_s < 0.8 * (by_buckets["max"].decode_tok_s or 0)
    assert local["off"].decode_tok_s == by_buckets["off"].decode_tok_s


def test_an_unknown_depth_is_explored_only_where_it_could_win() -> None:
    """Depth 0 measured only by the calibration (37.7 tok/s alone on a short code prompt): at
    20k, where the depth-3 line says 45, it cannot win (speed never rises with context) and is
    not tried; at 70k, where the line says 30, it could, and the class explores it (cold)."""
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=1.0, min_samples=2)
    stats = LearnedStats(settings)
    for bucket, context, speed in (("4k-16k", 10_000, 50.0), ("32k-64k", 45_000, 36.0)):
        train(stats, RequestClass(bucket, "code"), "max", speed, n=3, context=context)
        train(stats, RequestClass(bucket, "code"), "min", speed * 0.95, n=3, context=context)
    points = {"code": {"off": (100.0, 37.7)}}
    replica = Replica("m/one-process", True, 0, 4, alone_points=points)
    near = run(20_000, "code", replicas=[replica], stats=stats, settings=settings)
    assert near.profile == "max" and near.reason == "learned"
    far = run(70_000, "code", replicas=[replica], stats=stats, settings=settings)
    assert (far.profile, far.reason) == ("off", "explore")


def test_depths_are_ranked_by_decode_alone_since_one_process_prefills_alike() -> None:
    """max decodes 1.6x faster, but its cells happened to see slow prefills (little cache hit,
    long context) and off's fast ones: ranking each with its own prefill rate put off first on a
    36k prompt, whose expected prefill outweighs its decode."""
    stats = LearnedStats(NO_EXPLORE)
    cls = RequestClass("32k-64k", "code")
    for profile, decode, prefill_s in (("off", 25.0, 5.0), ("max", 40.0, 60.0)):
        for _ in range(5):
            obs = Observation(
                backend="m/one-process",
                profile=profile,
                request_class=cls,
                context_tokens=36_000,
                cached_tokens=0,
                output_tokens=400,
                draft_n=100 if profile == "max" else None,
                draft_n_accepted=80 if profile == "max" else None,
                decode_tok_s=decode,
                prefill_s=prefill_s,
                ttft_s=None,
                total_s=None,
                source="timings",
            )
            stats.observe(cls, profile, obs, level=1)
    assert run(36_000, "code", stats=stats).profile == "max"


def test_a_depth_that_could_still_win_keeps_the_class_exploring_at_the_cold_rate() -> None:
    """Two trusted depths end the cold phase only when no other depth could still win: depth 0
    with 4 requests at 33 tok/s, above the best trusted 29, is tried (a change detected had
    reset the class, and the race to two trusted depths was won by the two drafting ones: the
    class settled on min while depth 0 was the fastest). Measured below the best, it is not."""
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=1.0)
    code = RequestClass("<4k", "code")
    for off_speed, expected in ((33.0, ("off", "explore")), (20.0, ("min", "learned"))):
        stats = LearnedStats(settings)
        train(stats, code, "max", 28.0, n=5, context=600)
        train(stats, code, "min", 29.0, n=5, context=600)
        train(stats, code, "off", off_speed, n=4, context=600)
        d = run(600, "code", stats=stats, settings=settings, rng=Draws(0.0))
        assert (d.profile, d.reason) == expected


def _settles_after_a_change(seed: int) -> int | None:
    """Short code alone: drafting paid (depth 3 45 tok/s, 2 40, 0 33), then stops paying (3
    26.1, 2 28, 0 33.3: the relearn run's code on setup-b). The n-th request after the change
    that learned statistics first place at depth 0 (None: never in 40)."""
    code = RequestClass("<4k", "code")
    stats, rng = LearnedStats(S), random.Random(seed)
    truth = {"off": 33.0, "min": 40.0, "max": 45.0}

    def one() -> DepthDecision:
        d = run(600, "code", stats=stats, settings=S, rng=rng)
        train(stats, code, d.profile, truth[d.profile] * rng.uniform(0.95, 1.05), n=1, context=600)
        return d

    for _ in range(60):
        one()
    truth = {"off": 33.3, "min": 28.0, "max": 26.1}
    after = [one() for _ in range(40)]
    assert [c["class"] for c in stats.changes] == ["<4k/code@1"]
    settled = [n for n, d in enumerate(after, 1) if (d.profile, d.reason) == ("off", "learned")]
    if not settled:
        return None
    assert all(d.profile == "off" for d in after[settled[0] :] if d.reason == "learned")
    return settled[0]


def test_after_a_change_alone_the_class_explores_depth_0_again_and_moves_there() -> None:
    """Every seed moves within 30 requests of the change (16-30). When two trusted depths ended
    the cold phase, 3 seeds of these 8 moved only after 34-39 requests, and 2 of 12 never: the
    class settled on min with depth 0 a few requests short of trust, explored at 5 % since."""
    assert all((n := _settles_after_a_change(seed)) is not None and n <= 30 for seed in range(8))

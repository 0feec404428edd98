"""Router glue: slot-cache model, full cache holders, clock scale, learning switch, seed."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import pytest

from proxy.config.routing import RoutingSettings
from proxy.routing.busy import BusyDepths
from proxy.routing.classes import classify
from proxy.routing.depth_clock import DecodeRun, DepthClock, DepthRecord
from proxy.routing.features import RequestFeatures
from proxy.routing.load import RecentLoad
from proxy.routing.router import Outcome, PerRequestModel, Route, Router
from proxy.routing.slot_caches import SlotCaches
from proxy.routing.telemetry import Observation, ParsedUsage
from proxy.serving.backends import LiveBackend, LiveBackends
from supervisor.spec import BackendSpec
from supervisor.states import BackendState


def _features(session: str, tokens: int = 500) -> RequestFeatures:
    return RequestFeatures(
        api="chat",
        model="m",
        prompt_chars=tokens * 4,
        est_prompt_tokens=tokens,
        kind="prose",
        max_tokens=None,
        stream=False,
        session_key=session,
        has_tools=False,
        pinned_profile=None,
    )


def _observe(
    router: Router[LiveBackend],
    route: Route[LiveBackend],
    features: RequestFeatures,
    usage: ParsedUsage,
    *,
    sent_at: float,
    done_at: float,
    run: DepthRecord | None = None,
    others_at_end: int | None = None,
) -> Observation:
    outcome = Outcome(route, features, usage, sent_at, done_at, run or DepthRecord(), others_at_end)
    return router.observe(outcome)


@contextmanager
def _serving(
    router: Router[LiveBackend], route: Route[LiveBackend], *, prefill: bool = False
) -> Iterator[DecodeRun]:
    """As the exchange serves a route: a slot of its backend and a run on its process."""
    with router.backends.lease(route.backend), router.running(route, prefill=prefill) as run:
        yield run


def _sessions_routed(router: Router, prefix: str, n: int) -> list[Route]:
    """Route the first request of n new sessions named prefix0, prefix1, ..."""
    routes = [router.route("m", _features(f"{prefix}{i}"), exclude=()) for i in range(n)]
    assert all(r is not None for r in routes)
    return [r for r in routes if r is not None]


def _router(settings: RoutingSettings, slots: int = 2) -> Router:
    live = LiveBackends()
    for profile in ("off", "min", "max"):
        spec = BackendSpec(f"m/{profile}", "m", profile, ("x",))
        live.update(spec, BackendState.READY, f"http://127.0.0.1:1/{profile}", slots=slots)
    return Router(settings, live, rng=random.Random(0))


def test_slot_caches_follow_llama_servers_lru_slots() -> None:
    caches = SlotCaches()
    caches.use("b", "a", 50_000, slots=2)
    caches.use("b", "c", 300, slots=2)
    assert caches.holds("b", "a") and caches.victim_tokens("b", "new", 2) == 50_000
    assert caches.victim_tokens("b", "a", 2) == 0  # its own slot: nothing overwritten
    caches.use("b", "a", 51_000, slots=2)  # a's turn: c is now the least recently used
    assert caches.victim_tokens("b", "new", 2) == 300
    caches.use("b", "d", 100, slots=2)
    assert not caches.holds("b", "c") and caches.holds("b", "a")
    assert caches.victim_tokens("other", "x", 2) == 0


def test_slot_caches_never_count_a_busy_slot_as_the_victim() -> None:
    caches = SlotCaches()
    agent = caches.use("b", "agent", 80_000, slots=2)  # a long request, still running
    chat = caches.use("b", "chat", 300, slots=2)
    caches.release("b", chat)
    # The agent's slot is busy: a new session can only take the chat's slot.
    assert caches.victim_tokens("b", "new", 2) == 300
    caches.use("b", "new", 200, slots=2)  # overwrites the idle chat slot, not the agent's
    assert caches.holds("b", "agent") and not caches.holds("b", "chat")
    caches.release("b", agent)
    assert caches.victim_tokens("b", "other", 2) == 80_000  # now idle and least recent


def test_slot_caches_count_other_long_sessions_as_resident() -> None:
    caches = SlotCaches()
    caches.use("b", "agent-1", 40_000, slots=4)
    caches.use("b", "agent-2", 9_000, slots=4)
    caches.use("b", "chat", 300, slots=4)
    caches.use("b", None, 50_000, slots=4)  # a one-off request: no session comes back
    assert caches.resident("b", "new", 8192) == 2
    assert caches.resident("b", "agent-1", 8192) == 1  # not itself
    assert caches.resident("b", "new", 0) == 0  # disabled
    assert caches.resident("other", "new", 8192) == 0


def test_slot_caches_forget_busy_marks_of_requests_never_released() -> None:
    caches = SlotCaches()
    caches.use("b", "a", 50_000, slots=2)  # failed: never released
    caches.use("b", "c", 300, slots=2)
    caches.trim("b", in_flight=0, slots=2)  # the backend is idle: nothing is busy
    assert caches.victim_tokens("b", "new", 2) == 50_000


def test_a_session_whose_cache_was_overwritten_is_placed_afresh() -> None:
    router = _router(RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0), slots=1)
    first = router.route("m", _features("s1"), exclude=())
    assert first is not None and first.backend.name == "m/max"
    assert router.route("m", _features("s1"), exclude=()).reason == "affinity"  # type: ignore[union-attr]
    router.route("m", _features("s2"), exclude=())  # one slot: s2 overwrites s1's cache
    again = router.route("m", _features("s1"), exclude=())
    assert again is not None and again.reason != "affinity"


def test_a_full_cache_holder_stays_a_candidate() -> None:
    router = _router(RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0), slots=1)
    long = _features("agent", tokens=100_000)
    first = router.route("m", long, exclude=())
    assert first is not None
    first.backend.in_flight = 1  # the holder is full (one slot, busy)
    d = router.route("m", long, exclude=())
    # queueing behind one request beats re-processing 100k tokens elsewhere
    assert d is not None and (d.backend.name, d.reason) == (first.backend.name, "affinity")


def test_clock_scale_and_learning_switch() -> None:
    settings = RoutingSettings(clock_scale=50.0, exploration_rate=0.0, cold_exploration_rate=0.0)
    router = _router(settings)
    f = _features("s")
    route = router.route("m", f, exclude=())
    assert route is not None
    usage = ParsedUsage(output_tokens=101, first_token_at=10.0, last_token_at=12.0)
    obs = _observe(router, route, f, usage, sent_at=9.0, done_at=12.0)
    assert obs.decode_tok_s == 100 / (2.0 * 50.0)  # proxy seconds -> backend seconds
    assert obs.total_s == 3.0 * 50.0
    assert router.stats.table()  # learned
    off = _router(RoutingSettings(learning=False))
    route = off.route("m", f, exclude=())
    assert route is not None
    _observe(off, route, f, usage, sent_at=9.0, done_at=12.0)
    assert off.stats.table() == []


def test_seeded_routers_decide_alike() -> None:
    settings = RoutingSettings(seed=7, exploration_rate=0.2)

    def picks() -> list[str]:
        routes = _sessions_routed(Router(settings, _router(settings).backends), "s", 60)
        return [r.profile for r in routes]

    assert picks() == picks()


def test_seeded_draws_of_a_request_do_not_depend_on_earlier_decisions() -> None:
    # Timing races change which requests are decided first; a request's own draws must not
    # change with them (or one race reshuffles every later exploration).
    settings = RoutingSettings(seed=7, exploration_rate=0.2, cold_exploration_rate=0.5)

    def pick(warmup: int) -> list[str]:
        router = Router(settings, _router(settings).backends)
        _sessions_routed(router, "warm", warmup)
        return [r.reason for r in _sessions_routed(router, "s", 40)]

    first = pick(0)
    assert first == pick(3) == pick(11)
    assert "explore" in first  # the draws do explore, just the same way every time


def _one_process_router(settings: RoutingSettings, *, mixed: bool = False) -> Router:
    live = LiveBackends()
    spec = BackendSpec("m/one-process", "m", "one-process", ("x",))
    live.update(spec, BackendState.READY, "http://127.0.0.1:1", slots=4)
    router = Router(settings, live, rng=random.Random(0))
    router.per_request["m"] = PerRequestModel({"off": 0, "min": 2, "max": 3}, mixed)
    return router


def test_one_process_routes_a_depth_and_what_decodes_there_fixes_the_next() -> None:
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
    router = _one_process_router(settings)
    first = router.route("m", _features("a"), exclude=())
    assert first is not None
    assert (first.backend.name, first.profile, first.depth, first.level) == (
        "m/one-process",
        "max",
        3,
        1,
    )
    with _serving(router, first):
        assert router.decoding(first.backend.name) == {"max": 1}
        second = router.route("m", _features("b"), exclude=())
        assert second is not None
        # Beside it: the busy epoch's depth, cold off (the epoch, not the newcomer's own pick).
        assert (second.profile, second.depth, second.reason) == ("off", 0, "busy")
    assert dict(router.decoding(first.backend.name)) == {}
    # Mixed depths allowed: the long prompt gets its own depth, at load level 2.
    mixed = _one_process_router(settings, mixed=True)
    held = mixed.route("m", _features("a"), exclude=())
    assert held is not None
    with _serving(mixed, held):
        other = mixed.route("m", _features("b", tokens=60_000), exclude=())
        assert other is not None and (other.depth, other.level) == (0, 2)


def test_one_process_observations_are_kept_per_load_level() -> None:
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
    router = _one_process_router(settings)
    route = router.route("m", _features("a"), exclude=())
    assert route is not None
    usage = ParsedUsage(has_timings=True, prompt_n=500, predicted_n=100, predicted_ms=2000.0)
    with _serving(router, route) as run:
        pass
    _observe(router, route, _features("a"), usage, sent_at=0.0, done_at=3.0, run=run.record())
    rows = router.stats.table()
    assert [(r["class"], r["profile"], r["level"]) for r in rows] == [("<4k/prose@1", "max", 1)]


def test_the_load_at_its_end_is_read_when_it_ended_not_when_it_is_learned() -> None:
    """One person's agent sends its next request as soon as an answer is complete: by the time
    the deferred bookkeeping learns from the first, the second is in flight. Read then, a
    request that ran alone was learned at load level 2; the exchange reads it at the end."""
    usage = ParsedUsage(has_timings=True, prompt_n=500, predicted_n=100, predicted_ms=2000.0)
    levels = []
    for at_end in (0, None):
        settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
        router = _one_process_router(settings)
        first = router.route("m", _features("a"), exclude=())
        assert first is not None
        with _serving(router, first) as run:
            pass  # it ran alone
        with router.backends.lease(first.backend):  # the next one, already sent
            _observe(
                router,
                first,
                _features("a"),
                usage,
                sent_at=0.0,
                done_at=3.0,
                run=run.record(),
                others_at_end=at_end,
            )
        levels += [r["level"] for r in router.stats.table()]
    assert levels == [1, 2]


def test_one_process_remembers_its_recent_concurrency() -> None:
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
    router = _one_process_router(settings)
    backend = router.backends.get("m/one-process")
    assert backend is not None and "m/one-process" not in router.loads
    for n in range(3):
        backend.in_flight = n  # n others decoding when each arrives
        assert router.route("m", _features(f"s{n}"), exclude=()) is not None
    assert 1.0 < router.loads["m/one-process"].load < 3.0
    backend.in_flight = 0
    idle = router.route("m", _features("later"), exclude=())
    assert idle is not None and idle.level == 1  # decays: one busy moment is not a burst


def test_a_lone_request_counted_busy_says_the_load_that_made_it_so() -> None:
    """Sent alone right after a burst: the recent admissions place it at a busy load level
    (it is likely to have company), and its detail names that load, not only "busy"."""
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
    router = _one_process_router(settings)
    backend = router.backends.get("m/one-process")
    assert backend is not None
    backend.in_flight = 3
    for n in range(4):
        assert router.route("m", _features(f"s{n}"), exclude=()) is not None
    backend.in_flight = 0
    lone = router.route("m", _features("lone"), exclude=())
    assert lone is not None and lone.level > 1 and lone.in_flight == 0, lone
    load = router.loads["m/one-process"]  # after its own admission; the detail says the one before
    assert re.search(
        rf" \(load level {lone.level}: 0 other requests in flight, "
        r"[0-9.]+ decoding at recent admissions\)$",
        lone.detail,
    ), (lone.detail, load)
    alone = _one_process_router(settings).route("m", _features("first"), exclude=())
    assert alone is not None and alone.level == 1 and "load level" not in alone.detail


def test_a_request_ran_mixed_if_another_depth_decoded_at_any_time_of_its_run() -> None:
    clock = DepthClock()
    with clock.run("max", prefill=False) as alone, clock.run("max", prefill=False) as same:
        pass
    assert not alone.ran_mixed and not same.ran_mixed  # one depth throughout
    with clock.run("max", prefill=False) as first:
        with clock.run("off", prefill=False) as later:
            assert later.mix_mark is None  # starts beside max
        assert first.ran_mixed  # off came while it decoded
    assert later.ran_mixed
    with clock.run("off", prefill=False) as after:
        pass
    assert not after.ran_mixed  # the mix was over before it started


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_single_depth_clock_runs_only_while_the_process_is_busy_at_that_depth() -> None:
    depths = DepthClock(clock=(clock := _Clock()))
    with depths.run("max", prefill=False):
        clock.now = 5.0  # alone: not busy
        with depths.run("max", prefill=False):
            clock.now = 8.0  # two at max
            assert depths.seconds("max") == 3.0
            with depths.run("off", prefill=False):
                clock.now = 20.0  # mixed: neither depth's clock runs
            assert depths.seconds("off") == 0.0
            clock.now = 21.0
        clock.now = 30.0  # alone again
    assert depths.seconds("max") == 4.0


def test_a_run_at_one_depth_knows_how_many_decoded_beside_it() -> None:
    """The load level a busy run is compared at: the mean number of requests decoding over its
    time at one depth (2 for 6 s, then 4 for 2 s: 2.5), not what it saw when it started."""
    depths = DepthClock(clock=(clock := _Clock()))
    with depths.run("max", prefill=False) as run, depths.run("max", prefill=False):
        clock.now = 6.0
        with depths.run("max", prefill=False), depths.run("max", prefill=False):
            clock.now = 8.0
        assert run.record().seconds == 8.0
        assert run.record().load == pytest.approx((2 * 6.0 + 4 * 2.0) / 8.0)
        with depths.run("off", prefill=False):  # mixed: neither clock runs
            clock.now = 20.0
        assert run.record().load == pytest.approx(2.5)
    assert run.record().load == pytest.approx(2.5)


def test_an_idle_process_starts_a_new_busy_epoch_at_once() -> None:
    """An idle process has no epoch to keep: the first request of a burst starts a new one, so
    the deepest depth is explored when its requests will have the process to themselves."""
    settings = RoutingSettings(min_samples=2, busy_epoch_admissions=8)
    router = _one_process_router(settings)
    backend = router.backends.of_model("m")[0]
    state = router.stats.busy.setdefault(backend.name, BusyDepths())
    cls = classify(_features("x"), settings)
    for _ in range(3):
        state.observe(cls, 2, "off", 30.0, 10.0, decay=1.0)
    state.profile, state.left = "off", 6  # an epoch at off with admissions left
    router.loads[backend.name] = RecentLoad(load=4.0)
    with router.backends.lease(backend):
        busy = router.route("m", _features("a"), exclude=())
        assert busy is not None and (busy.profile, busy.reason) == ("off", "busy")
    burst = router.route("m", _features("b"), exclude=())  # idle again: a new epoch
    assert burst is not None and (burst.profile, burst.reason) == ("max", "busy")
    assert state.exploring


def test_a_stream_still_processing_its_prompt_decodes_at_no_depth_yet() -> None:
    """A long prompt at off, still being prefilled beside two requests at max, neither stops the
    max clock nor mixes their depths: it joins the decoding requests at its first token."""
    depths = DepthClock(clock=(clock := _Clock()))
    with depths.run("max", prefill=False) as one, depths.run("max", prefill=False):
        with depths.run("off", prefill=True) as long_prompt:
            clock.now = 10.0  # its prompt is processed: max alone decodes
            assert depths.seconds("max") == 10.0
            assert not one.ran_mixed
            long_prompt.decoding()  # its first token
            clock.now = 15.0
            assert depths.seconds("max") == 10.0  # mixed from here on
            assert one.ran_mixed
            assert long_prompt.record().seconds == 0.0
        assert depths.decoding == {"max": 2}
    assert not depths.decoding


def test_a_stream_that_never_sent_a_token_ran_at_no_depth() -> None:
    depths = DepthClock()
    with depths.run("off", prefill=True) as run:
        assert not depths.decoding
    assert run.record() == DepthRecord(mixed=True)  # nothing to learn from
    assert not depths.decoding


def test_busy_learning_weighs_runs_by_their_time_at_one_depth_not_by_how_fast_they_ended() -> None:
    """Two requests start together in a deep epoch; the fast one ends inside it, the slow one
    runs on after the process went back to off. Learning only from runs that stayed at one depth
    throughout kept the fast one alone, so the deep depth looked faster than it was."""
    router = _one_process_router(RoutingSettings(half_life_samples=1e12))  # no decay here
    backend = router.backends.of_model("m")[0]
    depths = router.clocks[backend.name] = DepthClock(clock=(clock := _Clock()))
    router.stats.busy[backend.name] = state = BusyDepths()
    features = _features("x")
    fast = slow = router.route("m", features, exclude=())
    assert fast is not None and slow is not None
    fast, slow = replace(fast, profile="max", depth=3), replace(slow, profile="max", depth=3)

    def usage(tokens: int, seconds: float) -> ParsedUsage:
        return ParsedUsage(
            has_timings=True, prompt_n=500, predicted_n=tokens, predicted_ms=seconds * 1000
        )

    with router.running(slow, prefill=False) as slow_run:
        with router.running(fast, prefill=False) as fast_run:
            clock.now = 10.0
            fast_record = replace(fast_run.record(), load=4.3)  # four or five decoding
        _observe(router, fast, features, usage(400, 10.0), sent_at=0, done_at=10, run=fast_record)
        with depths.run("off", prefill=False):  # the next epoch: off beside the slow one
            clock.now = 30.0
        slow_record = replace(slow_run.record(), load=3.6)
    assert slow_record.mixed and slow_record.seconds == 10.0
    _observe(router, slow, features, usage(600, 30.0), sent_at=0, done_at=30, run=slow_record)
    # Both spent the same 10 s at max only: they weigh alike, at their own speeds (40 and 20).
    cell = state.speeds[(fast.request_class.label, 4, "max")]  # load level 4 (4+)
    assert cell.weight == pytest.approx(2 * 10.0) and cell.requests == pytest.approx(2.0)
    assert math.exp(cell.mean) == pytest.approx(math.sqrt(40 * 20))


def _events(tokens: int) -> bytes:
    """``tokens`` stream events as llama-server sends them: one per token."""
    return b'data: {"choices":[{"delta":{"content":"x\\n\\n"}}]}\n\n' * tokens


def test_a_busy_speed_is_the_tokens_streamed_while_busy_at_one_depth() -> None:
    """A request at max decodes 300 tokens alone in 10 s (drafting pays most there), then 100
    in 10 s beside another at max. What the busy epochs learn is the 10 tok/s it decoded while
    busy, not its whole run's 20 tok/s: an exploring epoch starts on an idle process, so its
    requests' whole-run speeds made the deep depth look faster beside others than it was."""
    router = _one_process_router(RoutingSettings(half_life_samples=1e12))
    backend = router.backends.of_model("m")[0]
    router.clocks[backend.name] = DepthClock(clock=(clock := _Clock()))
    router.stats.busy[backend.name] = state = BusyDepths()
    features = _features("x")
    route = router.route("m", features, exclude=())
    assert route is not None
    route = replace(route, profile="max", depth=3, reason="busy")
    with _serving(router, route, prefill=True) as run:
        run.streamed(_events(1))  # its first token: it decodes from here
        clock.now = 10.0
        run.streamed(_events(299))  # alone: not counted
        with _serving(router, route, prefill=True) as other:
            other.streamed(_events(1))
            clock.now = 20.0
            run.streamed(_events(100))
        record = replace(run.record(), load=2.0)
    assert (record.seconds, record.tokens) == (10.0, 100)
    usage = ParsedUsage(has_timings=True, prompt_n=500, predicted_n=400, predicted_ms=20_000)
    _observe(router, route, features, usage, sent_at=0, done_at=20, run=record)
    cell = state.speeds[(route.request_class.label, 2, "max")]
    assert math.exp(cell.mean) == pytest.approx(10.0) and cell.weight == pytest.approx(10.0)


def test_a_cold_pick_at_the_deepest_depth_measures_the_shallowest_next() -> None:
    """cold_busy_role = max (a box known to batch drafts well) starts busy stretches at max and
    still learns whether decoding plain is faster: the other depth it measures is off."""
    settings = RoutingSettings(busy_epoch_admissions=3, min_samples=2, cold_busy_role="max")
    router = _one_process_router(settings)
    backend = router.backends.of_model("m")[0]
    usage = ParsedUsage(has_timings=True, prompt_n=500, predicted_n=256, predicted_ms=10_000.0)
    busy_alone = DepthRecord(seconds=10.0, load=2.0)
    with router.backends.lease(backend):
        routes = [router.route("m", _features(f"s{n}"), exclude=()) for n in range(3)]
        assert [(r.profile, r.reason) for r in routes if r] == [("max", "busy")] * 3
        for route in routes:
            assert route is not None
            with router.running(route, prefill=False):
                pass
            _observe(
                router, route, _features("x"), usage, sent_at=0.0, done_at=12.0, run=busy_alone
            )
    router.loads[backend.name] = RecentLoad(load=4.0)  # a burst began on the idle process
    nxt = router.route("m", _features("next"), exclude=())
    assert nxt is not None and (nxt.profile, nxt.reason) == ("off", "busy")


def test_a_busy_epoch_lasts_its_admissions_and_learns_from_time_at_one_depth() -> None:
    settings = RoutingSettings(busy_epoch_admissions=3, min_samples=2)
    router = _one_process_router(settings)
    backend = router.backends.of_model("m")[0]
    # 256 tokens at 25.6 tok/s: 10 s of decoding.
    usage = ParsedUsage(has_timings=True, prompt_n=500, predicted_n=256, predicted_ms=10_000.0)

    def observe(route: Route[LiveBackend], done_at: float, run: DepthRecord) -> None:
        _observe(router, route, _features("x"), usage, sent_at=0.0, done_at=done_at, run=run)

    with router.backends.lease(backend):  # one decoding already: the next are busy admissions
        with ExitStack() as running:
            routes = []
            for n in range(3):  # each admitted as the exchange admits it: routed, then run
                route = router.route("m", _features(f"s{n}"), exclude=())
                assert route is not None and (route.profile, route.reason) == ("off", "busy")
                running.enter_context(router.running(route, prefill=False))
                routes.append(route)
            state = router.stats.busy[backend.name]
            assert (state.left, state.sent["off"], state.outstanding("off")) == (0, 3, 3)
        assert state.finished["off"] == 3  # counted as they ended, however they ended
        for route in routes:  # each ran its 10 s with the process busy at off only
            observe(route, 12.0, DepthRecord(seconds=10.0))
        assert round(state.samples("off"), 1) == 3.0
        # The cold depth is known, but an exploring epoch waits for an idle process.
        held = router.route("m", _features("held"), exclude=())
        assert held is not None and (held.profile, held.reason) == ("off", "busy")
    # The cold depth is known and the process idle: the next epoch tries the deepest one.
    router.loads[backend.name] = RecentLoad(load=4.0)
    nxt = router.route("m", _features("next"), exclude=())
    assert nxt is not None and (nxt.profile, nxt.reason) == ("max", "busy")
    with router.running(nxt, prefill=False):
        assert router.snapshot()["busy"][backend.name] == {
            "profile": "max",
            "left": 2,
            "samples": {"off": 3.0},  # requests (decay aside)
            "outstanding": {"max": 1, "off": 0},  # held was routed but never ran
        }
    assert state.finished["max"] == 1
    # Half its run beside another depth (or alone): it weighs its 5 s; none of it: nothing.
    observe(nxt, 12.0, DepthRecord(mixed=True, seconds=5.0))
    (cell,) = (c for (_, _, p), c in state.speeds.items() if p == "max")
    assert cell.weight == 5.0
    observe(nxt, 12.0, DepthRecord(mixed=True))
    assert cell.weight == 5.0
    # A run at one depth throughout weighs its decoding time (10 s), not its prefill.
    observe(nxt, 60.0, DepthRecord(seconds=60.0))
    decay = 0.5 ** (1 / settings.half_life_samples)
    assert cell.weight == pytest.approx(5.0 * decay + 10.0)

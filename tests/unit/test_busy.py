"""The depth a busy process runs at (routing.busy): cold first, one epoch at the deepest depth,
then the likely faster one, with hysteresis, measuring the deepest again while the comparison is
open, on an idle process and within a budget; speeds weighted by time, counted in requests,
compared class by class and load level by load level, a cell measured cold only counting at the
measured gap shrunk toward the published loss. Plain values in."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings, decay_factor
from proxy.routing.busy import (
    PRIOR_GAP,
    PRIOR_REQUESTS,
    BusyDepths,
    Epoch,
    LogSpeed,
    held_cold,
    next_busy_depth,
)
from proxy.routing.classes import RequestClass
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation

SHORT = RequestClass("<4k", "prose")
LONG = RequestClass("32k+", "code")
EPOCH = 8
SECONDS = 10.0  # each request's time at one depth
LEVEL = 2  # the load level the runs of a test are measured at, unless it says otherwise


def measured(runs: dict[tuple[RequestClass, str], list[float]]) -> BusyDepths:
    state = BusyDepths()
    for (cls, profile), speeds in runs.items():
        for speed in speeds:
            state.observe(cls, LEVEL, profile, speed, SECONDS, decay=1.0)
    return state


def epoch(state: BusyDepths, *, calm: bool = True) -> Epoch:
    return next_busy_depth(state, "off", "max", min_samples=4, epoch=EPOCH, calm=calm)


def pick(state: BusyDepths) -> str:
    return epoch(state).profile


def test_cold_until_the_cold_depth_has_its_samples() -> None:
    state = BusyDepths()
    assert pick(state) == "off"
    for _ in range(3):
        state.observe(SHORT, LEVEL, "off", 30.0, SECONDS, decay=1.0)
    state.observe(SHORT, LEVEL, "off", 30.0, 100 * SECONDS, decay=1.0)  # long, but one request
    assert round(state.samples("off"), 2) == 1.06 and pick(state) == "off"
    for _ in range(3):
        state.observe(SHORT, LEVEL, "off", 30.0, 100 * SECONDS, decay=1.0)
    assert round(state.samples("off"), 2) == 4.06 and pick(state) == "max"  # known: one epoch


def test_a_clear_comparison_outranks_the_cold_depths_sample_count() -> None:
    """A process whose cold depth is off but which has measured max clearly faster (a restart
    from a saved state, or a calibrated pick that moved before anything held it) goes to max
    rather than running epochs at off until off has its samples (rtx3090-250w's concurrent
    trace: 8 admissions at 0.6x)."""
    state = measured({(SHORT, "off"): [20.0, 22.0, 18.0], (SHORT, "max"): [32.0] * 8})
    assert state.samples("off") < 4 and state.gap("max", "off").chance_faster > 0.8
    assert pick(state) == "max"
    state.profile = "max"
    assert pick(state) == "max"
    unsure = measured({(SHORT, "off"): [30.0, 33.0, 27.0], (SHORT, "max"): [31.0] * 8})
    assert 0.5 < unsure.gap("max", "off").chance_faster < 0.8
    assert pick(unsure) == "off"  # not clear: the cold depth gets its samples first


def test_a_longer_run_at_one_depth_weighs_more_in_the_mean_but_is_one_request() -> None:
    state = BusyDepths()
    state.observe(SHORT, LEVEL, "max", 20.0, SECONDS, decay=1.0)
    state.observe(SHORT, LEVEL, "max", 40.0, 3 * SECONDS, decay=1.0)
    cell = state.speeds[(SHORT.label, LEVEL, "max")]
    assert math.exp(cell.mean) == pytest.approx(20.0**0.25 * 40.0**0.75)  # time-weighted
    assert cell.requests == pytest.approx(1.6)  # (10 + 30)^2 / (10^2 + 30^2)
    state.observe(SHORT, LEVEL, "max", 30.0, 0.0, decay=1.0)  # no time at one depth: says nothing
    assert cell.requests == pytest.approx(1.6)


def test_the_deepest_depth_is_not_tried_again_while_its_epoch_is_out() -> None:
    state = measured({(SHORT, "off"): [30.0] * 6})
    state.sent["max"] = EPOCH
    assert pick(state) == "off"  # none of the epoch reported: a new one would be blind
    state.finished["max"] = EPOCH // 2
    assert pick(state) == "max"  # half of it came back and still too little to compare


def test_enter_the_deepest_depth_when_likely_faster_and_leave_when_likely_slower() -> None:
    near = {(SHORT, "off"): [30.0, 33.0, 27.0, 30.0], (SHORT, "max"): [31.0, 34.0, 28.0, 31.0]}
    state = measured(near)
    assert 0.5 < state.gap("max", "off").chance_faster < 0.8
    state.profile = "off"
    assert pick(state) == "max"  # open, on 4 requests each: measured once more
    state.sent["max"] = EPOCH
    assert pick(state) == "off"  # ... but not while that epoch is out
    state.profile = "max"
    assert pick(state) == "max"
    settled = measured({key: speeds * 2 for key, speeds in near.items()})
    settled.profile = "off"
    assert 0.5 < settled.gap("max", "off").chance_faster < 0.8
    assert pick(settled) == "off"  # on 8 each, not clearly faster: stay (a switch costs a mix)
    clear = measured({**near, (SHORT, "max"): [40.0, 44.0, 37.0, 41.0]})
    clear.profile = "off"
    assert clear.gap("max", "off").chance_faster > 0.8 and pick(clear) == "max"
    slower = measured({**near, (SHORT, "max"): [24.0, 26.0, 22.0, 24.0]})
    slower.profile = "max"
    assert slower.gap("max", "off").chance_faster < 0.2 and pick(slower) == "off"
    slower.profile = "off"
    assert pick(slower) == "off"  # clearly slower, even on few requests: not measured again


def test_depths_are_compared_class_by_class() -> None:
    # Plain requests measured on long agent prompts, drafting ones on short chats: a pooled
    # mean would credit drafting with the short chats' speed.
    state = measured({(LONG, "off"): [12.0] * 6, (SHORT, "max"): [40.0] * 6})
    assert state.gap("max", "off").weight == 0
    state = measured(
        {
            (LONG, "off"): [12.0] * 6,
            (LONG, "max"): [10.0] * 2,
            (SHORT, "off"): [40.0] * 4,
            (SHORT, "max"): [30.0] * 4,
        }
    )
    gap = state.gap("max", "off")
    # each class by its share of the time measured (8 runs of the long, 8 of the short)
    expected = (8 * math.log(10 / 12) + 8 * math.log(30 / 40)) / 16
    assert math.isclose(gap.mean, expected) and gap.weight == 6  # evidence: the fewer, summed


def test_a_class_counts_by_its_share_of_the_decode_time_not_by_its_requests() -> None:
    """Two long agent prompts that decode for minutes take more of the process than a dozen
    short chats: where drafting helps the chats and hurts the agents, the agents decide."""
    state = BusyDepths()
    for profile, chat, agent in (("off", 30.0, 20.0), ("max", 33.0, 12.0)):
        for _ in range(12):
            state.observe(SHORT, LEVEL, profile, chat, 5.0, decay=1.0)  # 12 chats of 5 s
        for _ in range(2):
            state.observe(LONG, LEVEL, profile, agent, 60.0, decay=1.0)  # 2 agent turns of 60 s
    gap = state.gap("max", "off")
    share = 2 * 12 * 5.0, 2 * 2 * 60.0
    expected = (share[0] * math.log(33 / 30) + share[1] * math.log(12 / 20)) / sum(share)
    assert math.isclose(gap.mean, expected) and gap.mean < 0  # counting requests: > 0
    assert gap.chance_faster < 0.5


def test_speeds_are_compared_at_one_load_level() -> None:
    """A slot decodes slower the more requests decode beside it: an epoch at the deepest depth
    that ran at 2-3 is compared with the cold depth at 2-3, not with the cold depth at 4+."""
    state = measured({(SHORT, "off"): [30.0] * 4, (SHORT, "max"): [27.0] * 4})
    for _ in range(4):
        state.observe(SHORT, 4, "off", 20.0, SECONDS, decay=1.0)  # busier: slower per slot
    assert set(state.speeds) == {
        (SHORT.label, 2, "off"),
        (SHORT.label, 2, "max"),
        (SHORT.label, 4, "off"),
    }
    gap = state.gap("max", "off")
    assert gap.weight == 4 and gap.mean < 0  # pooled over loads, 27 beat 25 and max looked faster
    assert gap.chance_faster < 0.2


def test_a_cell_measured_cold_only_counts_at_the_measured_gap_shrunk_to_the_prior() -> None:
    """Short chats drafted well in the deepest epoch; long agent prompts, most of the process's
    time, never ran there. Leaving them out moved setup-a's process to depth 3, where drafting
    halves the agents' speed: they count, at the chats' gap shrunk toward the prior."""
    chats = {(SHORT, "off"): [30.0] * 4, (SHORT, "max"): [36.0] * 4}
    alone = measured(chats)
    assert alone.gap("max", "off").chance_faster > 0.8  # the chats alone: max
    state = measured(chats)
    for _ in range(4):
        state.observe(LONG, LEVEL, "off", 12.0, 6 * SECONDS, decay=1.0)
    gap = state.gap("max", "off")
    measured_gap = math.log(36 / 30)
    guess = (4 * measured_gap + PRIOR_REQUESTS * PRIOR_GAP) / (4 + PRIOR_REQUESTS)
    expected = (80 * measured_gap + 240 * guess) / 320  # by time: chats 2 x 40 s, agents 240 s
    assert math.isclose(gap.mean, expected) and gap.weight == 4  # the prior is no evidence
    assert gap.chance_faster < 0.8  # no longer enough to move to max
    state.profile = "off"
    assert epoch(state) == Epoch("max", exploring=True)  # still open: measured, not entered


def test_an_exploring_epoch_starts_only_on_an_idle_process() -> None:
    """Started beside long requests at the cold depth, an epoch runs mixed until they end (and
    measures nothing); on an idle process its requests soon have it to themselves."""
    state = measured({(SHORT, "off"): [30.0] * 6})
    assert epoch(state, calm=False) == Epoch("off")
    assert epoch(state, calm=True) == Epoch("max", exploring=True)


def test_a_clearly_slower_deepest_depth_is_not_explored_again_on_few_requests() -> None:
    """One request at max that decoded at 60 % of off's speed: too few to call it known, but
    enough to rule it out: each exploring epoch there costs every request queued behind it."""
    state = measured({(SHORT, "off"): [30.0] * 6, (SHORT, "max"): [18.0]})
    gap = state.gap("max", "off")
    assert gap.weight < 4 / 2 and gap.chance_faster < 0.2
    assert epoch(state) == Epoch("off")
    unsure = measured({(SHORT, "off"): [30.0] * 6, (SHORT, "max"): [28.0, 33.0]})
    assert 0.2 < unsure.gap("max", "off").chance_faster < 0.8
    assert epoch(unsure) == Epoch("max", exploring=True)
    unsure.profile, unsure.exploring = "max", True  # its epoch explored: leaving needs no STAY
    assert epoch(unsure) == Epoch("max", exploring=True)
    unsure.exploring = False  # had it entered, it would stay at 0.5+
    assert epoch(unsure) == Epoch("max")


def test_the_cold_pick_holds_once_the_process_compared_the_two_depths() -> None:
    state = measured({(LONG, "max"): [30.0] * 8})
    state.cold = "max"
    assert held_cold(state, "off") == "off"  # off not measured yet: the pick moves
    state.observe(LONG, LEVEL, "off", 18.0, SECONDS, decay=1.0)
    assert held_cold(state, "off") == "max"  # compared: the comparison moves it, not the pick
    assert held_cold(state, "max") == "max"
    state.cold = None
    assert held_cold(state, "off") == "off"  # no epoch chosen yet


def test_one_depth_only_is_always_that_depth() -> None:
    state = measured({(SHORT, "off"): [30.0] * 10})
    only = next_busy_depth(state, "off", "off", min_samples=4, epoch=EPOCH)
    assert only == Epoch("off")


def test_equal_speeds_have_no_spread_whatever_rounding_leaves() -> None:
    cell = LogSpeed()
    for _ in range(2):
        cell.add(3.735, 2.5, decay=1.0)
    assert cell.m2 < 0  # rounding: -4e-15, whose square root raised in the router's hot path
    assert cell.sd == 0.0


AGENT = RequestClass("64k+", "code")  # a class of the default buckets


def test_what_a_process_measured_busy_survives_a_restart(tmp_path: Path) -> None:
    settings = RoutingSettings(min_samples=4)
    stats = LearnedStats(settings)
    stats.busy["m/one-process"] = measured(
        {(SHORT, "off"): [30.0] * 6, (SHORT, "max"): [40.0] * 6, (AGENT, "off"): [12.0] * 6}
    )
    stats.busy["m/one-process"].profile, stats.busy["m/one-process"].left = "max", 3
    stats.busy["m/two"] = measured({(SHORT, "off"): [30.0]})
    path = tmp_path / "learned.json"
    stats.save(path)
    loaded = LearnedStats.load(path, settings)
    assert loaded.load_report == "loaded 0 cells"
    state = loaded.busy["m/one-process"]
    assert state.speeds == stats.busy["m/one-process"].speeds
    assert (state.profile, state.left) == (None, 0)  # the epoch was the old process's
    assert pick(state) == "max"  # no cold epochs again: it knows max is faster when busy

    narrower = RoutingSettings(min_samples=4, context_buckets=[4096])  # no "64k+" any more
    assert LearnedStats.load(path, narrower).load_report == "loaded 0 cells, dropped 1"

    state_json = json.loads(path.read_bytes())
    older = json.loads(path.read_bytes())
    del older["busy"]["m/two"][0]["level"]  # a file from before speeds were kept per load
    path.write_text(json.dumps(older))
    assert LearnedStats.load(path, settings).load_report == "loaded 0 cells, dropped 1"
    state_json["busy"]["m/two"][0]["weight"] = -1.0  # not a measurement: that row alone goes
    path.write_text(json.dumps(state_json))
    broken = LearnedStats.load(path, settings)
    assert broken.load_report.startswith("loaded 0 cells, dropped 1 (1 untrusted; kept as ")
    assert broken.busy["m/one-process"].speeds == stats.busy["m/one-process"].speeds
    assert broken.busy["m/two"].speeds == {}


def _ran(stats: LearnedStats, cls: RequestClass, profile: str, speed: float) -> None:
    """One request beside others at ``profile`` throughout, fed as the router feeds both: the
    busy speeds (by its time) and the class's cells at its load level."""
    out = 400
    drafted = 100 if profile != "off" else None
    stats.busy["b"].observe(cls, LEVEL, profile, speed, out / speed, decay_factor(50.0))
    obs = Observation(
        backend="b",
        profile=profile,
        request_class=cls,
        context_tokens=600,
        cached_tokens=0,
        output_tokens=out,
        draft_n=drafted,
        draft_n_accepted=70 if drafted else None,
        decode_tok_s=speed,
        prefill_s=0.5,
        ttft_s=None,
        total_s=None,
        source="timings",
    )
    stats.observe(cls, profile, obs, level=LEVEL)


def test_a_class_whose_speed_changed_beside_others_moves_the_process_soon() -> None:
    """The relearn run (docs/benchmarks.md): a process busy at max for prose and code alike;
    then drafting stops paying on code (halved, below depth 0). Beside others the depth is the
    process's, so the class's reset cells alone change nothing; the busy speeds of the depth
    that moved follow the change too, and the process, whose time now loses more on code than
    it gains on prose, goes back to depth 0 after 11 requests of each (19 on the decay alone)."""
    stats = LearnedStats(RoutingSettings(half_life_samples=50.0))
    stats.busy["b"] = state = BusyDepths()
    code = RequestClass("<4k", "code")
    for profile, speed, n in (("off", 30.0, 10), ("max", 40.0, 20)):
        for _ in range(n):
            _ran(stats, SHORT, profile, speed)
            _ran(stats, code, profile, speed)
    state.profile = "max"
    assert next_busy_depth(state, "off", "max", 5, EPOCH, calm=False).profile == "max"
    moved = None
    for n in range(1, 40):
        _ran(stats, SHORT, "max", 40.0)
        _ran(stats, code, "max", 20.0)
        if next_busy_depth(state, "off", "max", 5, EPOCH, calm=False).profile == "off":
            moved = n
            break
    assert [c["class"] for c in stats.changes] == ["<4k/code@2"]
    assert moved is not None and moved <= 12

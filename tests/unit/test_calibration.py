"""The start-up calibration as data (routing.calibration): the cold rule it implies per load
level, the busy epochs' prior it gives, its key, and its place in the learned file. Plain values
in; the measurement itself runs against real simulators (tests/proxy/test_calibration.py)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings
from proxy.routing.busy import PRIOR_GAP, BusyDepths, Epoch, next_busy_depth
from proxy.routing.calibrate import identity
from proxy.routing.calibration import BUSY_MARGIN, Calibration, Cell, KindCell
from proxy.routing.classes import RequestClass
from proxy.routing.depth import Replica, decide_depth
from proxy.routing.load import RecentContext, RecentLoad
from proxy.routing.router import PerRequestModel, Router
from proxy.routing.stats import LearnedStats
from proxy.serving.backends import LiveBackends
from supervisor.spec import BackendSpec
from supervisor.states import BackendState
from tests.support.routing_inputs import feat

LEVELS = [1, 2, 4]


def calibration(alone: float, busy: float, *, slots: int = 4) -> Calibration:
    """depth 0 at 30 tok/s alone and 20 busy; the deepest depth at ``alone`` / ``busy`` x those."""
    cells = (
        Cell(1, 0, 30.0, 2),
        Cell(1, 3, 30.0 * alone, 2, 0.8),
        Cell(slots, 0, 20.0, slots),
        Cell(slots, 3, 20.0 * busy, slots, 0.7),
    )
    kinds = (KindCell("code", 0, 30.0, 100.0), KindCell("code", 3, 30.0 * alone, 100.0))
    return Calibration("k", "llama-server", "m.gguf", slots, cells, 1.0, 20.0, alone_kinds=kinds)


def test_beside_others_the_cold_pick_is_the_depth_measured_clearly_faster() -> None:
    batched = calibration(1.7, 1.2)
    assert batched.cold_roles(LEVELS) == {2: "max", 4: "max"}  # alone: the content rules
    split = calibration(1.7, 0.8)
    assert split.cold_roles(LEVELS) == {2: "off", 4: "off"}
    # within the margin, off: the published default of most builds, and the measurement noise
    assert calibration(1.7, 1.0 + BUSY_MARGIN / 2).cold_roles(LEVELS) == {2: "off", 4: "off"}


def split_by_kind(alone: float, code: float, prose: float, *, slots: int = 4) -> Calibration:
    """``calibration(alone, busy)`` whose busy burst measured code at ``code`` x depth 0 and
    prose at ``prose`` x (busy: their mean)."""
    busy = [(kind, r) for kind, r in (("code", code), ("prose", prose))]
    kinds = tuple(
        KindCell(kind, depth, 20.0 * (r if depth else 1.0), 100.0, slots)
        for kind, r in busy
        for depth in (0, 3)
    )
    return replace(calibration(alone, (code + prose) / 2, slots=slots), busy_kinds=kinds)


def test_the_busy_gap_is_taken_by_content_kind() -> None:
    """rtx3090-250w-like: beside others depth 3 decodes code 1.56x depth 0 and prose 0.85x.
    Carried to an agent's 15k-token prompts the code gap still calls for max; the burst's
    mean (1.2x) carried there called for off, where depth 3 was the faster."""
    c = split_by_kind(2.0, 1.56, 0.85)
    assert c.ratio(4, "code") == pytest.approx(1.56) and c.ratio(4, "prose") == pytest.approx(0.85)
    assert c.ratio(4) == pytest.approx(1.205)
    assert c.cold_role(4, 15_000, {"code": 1.0}) == "max"
    assert c.cold_role(4, 15_000, {"code": 0.9, "prose": 0.1}) == "max"
    assert c.cold_role(4, 15_000, {"prose": 1.0}) == "off"
    assert c.cold_role(4, 15_000) == "off"  # the mean
    mean_gap = c.log_gap(4, 15_000)
    assert mean_gap is not None
    assert c.log_gap(4, 15_000, "code") == pytest.approx(mean_gap + math.log(1.56 / 1.205))
    assert c.findings(LEVELS)["4"]["by_kind"] == {"code": 1.56, "prose": 0.85}
    # measured before kinds were kept beside others: the mean, whatever the content
    older = calibration(2.0, 1.205)
    assert older.cold_role(4, 15_000, {"code": 1.0}) == "off"
    assert "by_kind" not in older.findings(LEVELS)["4"]
    again = Calibration.from_json(json.loads(json.dumps(c.to_json())))
    assert again.busy_kinds == c.busy_kinds and again.cold_role(4, 15_000, {"code": 1.0}) == "max"


def test_a_busy_process_serving_agents_takes_the_code_gap() -> None:
    """The busy context's content is its admissions' (by tokens): agents' code prompts make the
    first busy stretch max on the rtx3090-250w-like calibration; the burst's mean kept it off."""
    assert _busy_pick(_router_with(split_by_kind(2.0, 1.56, 0.85)), 12_000, 6) == "max"
    assert _busy_pick(_router_with(calibration(2.0, 1.205)), 12_000, 6) == "off"
    # The request being admitted counts: on a process that served nothing yet (a request in
    # flight from before), an agent's code prompt is what its first busy epoch is chosen for
    # (without it, nothing but the prior: the burst's mean, off).
    router = _router_with(split_by_kind(2.0, 1.7, 0.85))
    backend = router.backends.of_model("m")[0]
    with router.backends.lease(backend):
        busy = router.route("m", feat(12_000, "code"), exclude=())
    assert busy is not None and (busy.reason, busy.profile) == ("busy", "max")


def test_alone_drafting_that_lost_makes_the_alone_rule_off() -> None:
    assert calibration(0.9, 0.7).cold_roles(LEVELS) == {1: "off", 2: "off", 4: "off"}


def test_busy_levels_stand_on_the_slot_count_measurement() -> None:
    c = calibration(1.7, 1.2)
    assert (c.measured_load(1), c.measured_load(2), c.measured_load(4)) == (1, 4, 4)
    two = calibration(1.7, 1.2, slots=2)
    assert two.measured_load(4) == 2  # a process never decodes more than its slots
    alone_only = Calibration("k", "b", "m", 1, (Cell(1, 0, 30.0, 2), Cell(1, 3, 50.0, 2)), 1, 1)
    assert alone_only.cold_roles(LEVELS) == {}  # -np 1: nothing said about busy levels


def test_the_measured_gap_replaces_the_published_prior_of_the_busy_epochs() -> None:
    c = calibration(1.7, 1.3)
    assert c.log_gap(4) == pytest.approx(math.log(1.3))
    short, long = RequestClass("<4k", "prose"), RequestClass("32k+", "code")
    state = BusyDepths()
    for _ in range(6):  # off measured in two classes, max only in one, where it ties
        state.observe(short, 4, "off", 20.0, 10.0, decay=1.0)
        state.observe(long, 4, "off", 20.0, 10.0, decay=1.0)
        state.observe(short, 4, "max", 20.0, 10.0, decay=1.0)
    published = state.gap("max", "off")
    calibrated = state.gap("max", "off", lambda label, level: c.log_gap(level))
    assert published.mean < 0 < calibrated.mean  # the unmeasured class follows the measurement
    at_two = state.gap("max", "off", lambda label, level: 5.0 if level == 2 else None)
    assert at_two.mean == pytest.approx(published.mean)  # per level
    # the unmeasured class holds a third of the time, at the tie (0) shrunk toward the prior
    assert published.mean == pytest.approx(1 / 3 * (3 * PRIOR_GAP) / (6 + 3))
    assert calibrated.mean == pytest.approx(1 / 3 * (3 * math.log(1.3)) / (6 + 3))


def test_json_round_trip_and_refusal() -> None:
    c = calibration(1.7, 1.2)
    again = Calibration.from_json(json.loads(json.dumps(c.to_json())))
    assert again == c  # as measured: a restart reports what the first run did
    edge = Calibration(
        "k", "b", "m", 1, (Cell(1, 0, 2576.97501, 2), Cell(1, 3, 30.12345, 2)), 1.0, 1.0
    )
    kept = Calibration.from_json(json.loads(json.dumps(edge.to_json())))
    assert kept.report(LEVELS) == edge.report(LEVELS)
    assert again.cold_roles(LEVELS) == c.cold_roles(LEVELS)
    assert again.speed(4, 3) == pytest.approx(24.0)
    assert again.acceptance() == pytest.approx(0.8)
    assert again.alone_kinds == c.alone_kinds
    older = {k: v for k, v in c.to_json().items() if k != "alone_kinds"}
    assert Calibration.from_json(older).alone_kinds == ()  # measured before kinds were kept
    for bad in (
        {**c.to_json(), "alone_kinds": [["poetry", 3, 40.0, 100.0]]},
        {**c.to_json(), "alone_kinds": [["code", 3, 0.0, 100.0]]},
        {**c.to_json(), "busy_kinds": [["code", 3, 40.0, 100.0, 0]]},  # no requests decoding
        {**c.to_json(), "busy_kinds": [["code", 3, 40.0, 100.0, 4, "extra"]]},
        {**c.to_json(), "cells": []},
        {**c.to_json(), "cells": [[1, 0, -3.0, 2, None]]},
        {**c.to_json(), "cells": [[1, 3, 30.0, 2, 1.5]]},
    ):
        with pytest.raises(ValueError):
            Calibration.from_json(bad)


def test_the_state_file_keeps_calibrations_and_older_files_still_load(tmp_path: Path) -> None:
    settings = RoutingSettings()
    stats = LearnedStats(settings)
    stats.calibrations["k"] = calibration(1.7, 0.8)
    path = tmp_path / "state.json"
    stats.save(path)
    loaded = LearnedStats.load(path, settings)
    assert loaded.calibrations["k"].cold_roles(LEVELS) == {2: "off", 4: "off"}
    older = json.loads(path.read_text())
    del older["calibrations"]  # a file written before calibrations: version 1 all the same
    path.write_text(json.dumps(older))
    assert LearnedStats.load(path, settings).load_report.startswith("loaded")
    older["calibrations"] = {"k": {"cells": "garbage"}, "j": calibration(1.7, 0.8).to_json()}
    path.write_text(json.dumps(older))
    kept = LearnedStats.load(path, settings)  # the broken one alone is dropped
    assert kept.load_report.startswith("loaded 0 cells, dropped 1 (1 untrusted; kept as ")
    assert list(kept.calibrations) == ["j"]


def test_the_key_follows_binary_model_and_flags(tmp_path: Path) -> None:
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_text("v1")
    model.write_text("weights")
    argv = [str(binary), "-m", str(model), "-np", "4"]
    first = identity(argv, None, "qwen")
    assert identity(argv, None, "qwen") == first
    assert first.model == str(model)
    assert identity([*argv[:-1], "2"], None, "qwen").key != first.key  # another -np
    model.write_text("other weights")
    assert identity(argv, None, "qwen").key != first.key  # another model file
    model.write_text("weights")
    binary.write_text("v2 (rebuilt)")
    assert identity(argv, None, "qwen").key != first.key
    assert identity([], "http://gpu:8080", "qwen").binary == "http://gpu:8080"


DEPTHS = {"off": 0, "min": 2, "max": 3}


def test_a_calibrated_replica_beside_others_starts_where_it_measured_faster() -> None:
    settings = RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0)
    stats = LearnedStats(settings).for_model("")
    busy = Replica("b", True, 1, 4, recent_load=2.0)  # the request will decode beside another
    chat = feat(600)
    plain = decide_depth(chat, [busy], DEPTHS, stats, settings, random.Random(1), mixed=True)
    assert plain is not None and (plain.profile, plain.reason) == ("off", "rule")
    measured = calibration(1.7, 1.2)
    calibrated = Replica("b", True, 1, 4, recent_load=2.0, calibration=measured)
    found = decide_depth(chat, [calibrated], DEPTHS, stats, settings, random.Random(1), mixed=True)
    assert found is not None and (found.profile, found.reason) == ("max", "rule")
    # The short prompts' 1.2x, carried to a 40k agent prompt along the published decline, is
    # a loss there: off.
    agent = feat(40_000, "code")
    long = decide_depth(agent, [calibrated], DEPTHS, stats, settings, random.Random(1), mixed=True)
    assert long is not None and long.profile == "off"
    alone = Replica("b", True, 0, 4, calibration=calibration(0.9, 0.7))
    lost = decide_depth(chat, [alone], DEPTHS, stats, settings, random.Random(1))
    assert lost is not None and lost.profile == "off"  # short would be max by the rules


def test_the_short_prompts_gap_is_carried_along_the_published_decline_with_context() -> None:
    """llama.cpp, 4 drafts: +147-152 % at ~100 tokens, +44 % at 34K (published-figures.md)."""
    c = calibration(2.5, 1.2)
    assert c.log_gap(1, 34_000) == pytest.approx(math.log(1.44))
    assert c.cold_role(4, 0) == "max"
    assert c.cold_role(4, 10_000) == "off"  # 1.2x on short prompts: ~1.02x at 10k
    assert c.cold_role(1, 100_000) is None  # alone: the content rules and the trend decide


def test_a_calibrated_busy_process_starts_its_epochs_where_it_measured_faster() -> None:
    state = BusyDepths()
    assert next_busy_depth(state, "max", "off", 4, 8).profile == "max"
    assert next_busy_depth(state, "off", "max", 4, 8).profile == "off"


def test_the_calibrations_guess_is_checked_on_a_busy_process_too() -> None:
    """Started at max on the calibration's word (short prompts), a saturated process is seldom
    idle: off's first epoch comes as soon as max has its samples, idle or not, once."""
    state = BusyDepths()
    for _ in range(4):
        state.observe(RequestClass("32k+", "code"), 4, "max", 20.0, 10.0, decay=1.0)
    busy = next_busy_depth(state, "max", "off", 4, 8, calm=False)
    assert busy.profile == "max"  # without the calibration: off waits for an idle moment
    first = next_busy_depth(state, "max", "off", 4, 8, calm=False, confirm=True)
    assert first == Epoch("off", exploring=True, admissions=4)  # half an epoch: a check
    state.sent["off"] += 8
    again = next_busy_depth(state, "max", "off", 4, 8, calm=False, confirm=True)
    assert again.profile == "max"  # once: later ones wait for an idle moment again


def _router_with(measured: Calibration) -> Router:
    live = LiveBackends()
    spec = BackendSpec("m/one-process", "m", "one-process", ("x",))
    live.update(spec, BackendState.READY, "http://127.0.0.1:1", slots=4)
    router = Router(RoutingSettings(), live, rng=random.Random(0))
    router.per_request["m"] = PerRequestModel(DEPTHS)
    router.calibrated["m/one-process"] = measured
    return router


def _busy_pick(router: Router, tokens: int, admissions: int) -> str:
    """``admissions`` requests of ``tokens`` admitted one after another, then one beside
    another: the depth of the busy epoch it gets."""
    backend = router.backends.of_model("m")[0]
    for _ in range(admissions):
        route = router.route("m", feat(tokens, "code") if tokens > 4096 else feat(300), exclude=())
        assert route is not None
    with router.backends.lease(backend):
        router.loads[backend.name] = replace(router.loads.get(backend.name, RecentLoad()), load=3.0)
        busy = router.route("m", feat(300), exclude=())
        assert busy is not None and busy.reason == "busy", busy
        with router.running(busy, prefill=False):  # admitted: the epoch counts it
            pass
    return busy.profile


def test_a_busy_process_carries_the_calibrated_gap_to_the_context_it_serves() -> None:
    """setup-b-batched-like (1.2x at 4 slots on short prompts): short chats make the first
    busy stretch max; long agent prompts (token-weighted: they hold the process) make it off;
    with nothing admitted yet, the prior context (long_context_tokens) keeps it off."""
    assert _busy_pick(_router_with(calibration(1.7, 1.2)), 300, 12) == "max"
    assert _busy_pick(_router_with(calibration(1.7, 1.2)), 40_000, 3) == "off"
    assert _busy_pick(_router_with(calibration(1.7, 1.2)), 300, 0) == "off"


def test_the_carried_pick_holds_once_the_process_compared_the_two_depths() -> None:
    """Started at max on short chats, a process checked off once (one request back, much
    slower); then agents' long prompts carry the calibrated pick to off. It stays at max: the
    comparison, not the carry, moves a process that has measured both depths. Moved by the
    carry, it ran off until off had its own samples (rtx3090-250w's concurrent trace)."""
    router = _router_with(calibration(1.7, 1.2))
    state = router.stats.busy.setdefault("m/one-process", BusyDepths())
    chat = RequestClass("<4k", "code")
    for _ in range(8):
        state.observe(chat, 2, "max", 32.0, 10.0, decay=1.0)
    state.observe(chat, 2, "off", 18.0, 10.0, decay=1.0)
    state.profile, state.exploring, state.cold, state.left = "off", True, "max", 0
    state.sent.update({"max": 8, "off": 8})
    state.finished.update(state.sent)
    assert _busy_pick(router, 40_000, 3) == "max"
    assert state.cold == "max"
    fresh = _router_with(calibration(1.7, 1.2))
    assert _busy_pick(fresh, 40_000, 3) == "off"  # nothing compared: the carried pick stands
    assert fresh.stats.busy["m/one-process"].cold == "off"  # what a later pick may be held to


def test_the_check_of_the_calibrations_guess_runs_half_an_epoch() -> None:
    """Calibrated at max and measured there, a busy process checks off for half an epoch (4
    admissions), then goes back to max: the guess is usually right, and each of the check's
    admissions runs at the depth measured slower. A whole epoch cost rtx3090-250w's concurrent
    trace 8 requests at depth 0, where depth 3 has 1.5x its goodput."""
    router = _router_with(calibration(1.7, 1.2))
    state = router.stats.busy.setdefault("m/one-process", BusyDepths())
    for _ in range(5):
        state.observe(RequestClass("<4k", "code"), 2, "max", 32.0, 10.0, decay=1.0)
    state.profile, state.cold, state.left = "max", "max", 0
    state.sent["max"] = 8
    state.finished.update(state.sent)
    # 12 short chats alone first: the busy context's long prior fades
    picks = [_busy_pick(router, 300, 12 if i == 0 else 0) for i in range(8)]
    assert picks == ["off"] * 4 + ["max"] * 4


def test_the_busy_pick_is_made_at_the_load_the_process_is_busy_at() -> None:
    """Measured at 2 decoding as well as at 4 (a build that batches drafts well: depth 3 2.6x
    depth 0 at 2, 1.4x at 4): a process busy at 2-3 decoding starts its busy epoch at max, on
    the prior's long context too; one busy at 4 or more at off. The slot count's verdict alone
    sent a process at 2-3 decoding, most of the concurrent trace, to off on agents' prompts."""
    two = calibration(2.0, 1.4)
    cells = (*two.cells, Cell(2, 0, 25.0, 2), Cell(2, 3, 25.0 * 2.6, 2, 0.8))
    measured = replace(two, cells=cells)
    for recent_load, expected in ((2.5, "max"), (4.0, "off")):
        router = _router_with(measured)
        backend = router.backends.of_model("m")[0]
        with router.backends.lease(backend):
            router.loads[backend.name] = RecentLoad(load=recent_load)
            busy = router.route("m", feat(12_000, "code"), exclude=())
        assert busy is not None and (busy.reason, busy.profile) == ("busy", expected)


def test_the_burst_of_two_is_pooled_with_the_slot_counts() -> None:
    """The burst of two rests on one request of each kind per depth: on setup-b (truth
    0.92-0.98x at 2) it measured up to 1.07x, across the 5 % margin. Pooled in log with the slot
    count's (0.96x, twice the requests) by their requests, the verdict at 2 stays off; a clear
    lead at 2 still carries it."""
    b = calibration(1.7, 0.96)
    noisy = replace(b, cells=(*b.cells, Cell(2, 0, 25.0, 2), Cell(2, 3, 25.0 * 1.07, 2, 0.7)))
    assert noisy.ratio(2) == pytest.approx(math.exp((2 * math.log(1.07) + 4 * math.log(0.96)) / 6))
    assert noisy.cold_role(2) == "off" and noisy.cold_role(4) == "off"
    assert noisy.ratio(4) == pytest.approx(0.96)  # the slot count's own
    batched = replace(b, cells=(*b.cells, Cell(2, 0, 25.0, 2), Cell(2, 3, 25.0 * 1.45, 2, 0.7)))
    assert batched.cold_role(2) == "max"


def test_the_prior_context_fades_as_the_process_serves() -> None:
    """The long prior context is a guess for a process that has served nothing yet: after 30
    short chats the busy context is theirs, and a gap measured at 1.14x (a loaded machine's
    setup-b-batched) stays above the 5 % margin. Counted at full weight beside the decayed
    count, the prior held it near 5k tokens, and the first busy stretch ran off."""
    assert _busy_pick(_router_with(calibration(1.7, 1.136)), 300, 30) == "max"
    recent = RecentContext()
    assert recent.tokens(32768) == 32768
    for _ in range(30):
        recent = recent.admit(300, 0.5 ** (1 / 8), "code")
    assert recent.tokens(32768) < 1000

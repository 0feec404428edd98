"""The depth a busy process runs at (routing.busy): cold first, one epoch at the deepest depth,
then the likely faster one, with hysteresis; speeds compared class by class. Plain values in."""

from __future__ import annotations

import math

from proxy.routing.busy import FULL_WEIGHT_TOKENS, BusyDepths, next_busy_depth
from proxy.routing.classes import RequestClass

SHORT = RequestClass("<4k", "prose")
LONG = RequestClass("32k+", "code")
EPOCH = 8


def measured(runs: dict[tuple[RequestClass, str], list[float]]) -> BusyDepths:
    state = BusyDepths()
    for (cls, profile), speeds in runs.items():
        for speed in speeds:
            state.observe(cls, profile, speed, FULL_WEIGHT_TOKENS, decay=1.0)
    return state


def pick(state: BusyDepths) -> str:
    return next_busy_depth(state, "off", "max", min_samples=4, epoch=EPOCH)


def test_cold_until_the_cold_depth_has_its_samples() -> None:
    state = BusyDepths()
    assert pick(state) == "off"
    for _ in range(3):
        state.observe(SHORT, "off", 30.0, FULL_WEIGHT_TOKENS, decay=1.0)
    state.observe(SHORT, "off", 30.0, FULL_WEIGHT_TOKENS // 4, decay=1.0)  # a short answer
    assert state.samples("off") == 3.25 and pick(state) == "off"
    state.observe(SHORT, "off", 30.0, 10_000, decay=1.0)  # a long one counts once
    assert pick(state) == "max"  # known: now one epoch at the deepest depth


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
    assert pick(state) == "off"  # not clearly faster: stay where it is (a switch costs a mix)
    state.profile = "max"
    assert pick(state) == "max"
    clear = measured({**near, (SHORT, "max"): [40.0, 44.0, 37.0, 41.0]})
    clear.profile = "off"
    assert clear.gap("max", "off").chance_faster > 0.8 and pick(clear) == "max"
    slower = measured({**near, (SHORT, "max"): [24.0, 26.0, 22.0, 24.0]})
    slower.profile = "max"
    assert slower.gap("max", "off").chance_faster < 0.5 and pick(slower) == "off"


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
    expected = (2 * math.log(10 / 12) + 4 * math.log(30 / 40)) / 6  # weighted by the fewer
    assert math.isclose(gap.mean, expected) and gap.weight == 6


def test_one_depth_only_is_always_that_depth() -> None:
    state = measured({(SHORT, "off"): [30.0] * 10})
    assert next_busy_depth(state, "off", "off", min_samples=4, epoch=EPOCH) == "off"

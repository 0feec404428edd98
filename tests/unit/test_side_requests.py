"""Side requests told from an agent's turns, each rule a setting, and the id_slot each gets: the
kept slot for side requests, the other one for the rest on two slots, none otherwise."""

from __future__ import annotations

import json
from dataclasses import replace

from proxy.config.side_requests import SideRequestSettings
from proxy.routing.features import RequestFeatures
from proxy.serving.depth_field import with_depth, with_integer
from proxy.serving.side_requests import SLOT_KEY, side_rule, slot_of

TURN = RequestFeatures(
    api="messages", model="claude-sonnet-4-5", prompt_chars=90_000, est_prompt_tokens=30_000,
    kind="code", max_tokens=32_000, stream=True, session_key="agent", has_tools=True,
    pinned_profile=None,
)  # fmt: skip
TITLE = replace(TURN, max_tokens=512, has_tools=False, est_prompt_tokens=300, session_key=None)
ON = SideRequestSettings(slot=1)


def rule(features: RequestFeatures, live: str | None, settings: SideRequestSettings) -> str | None:
    """side_rule with the client's name the features' own (the proxy passes the one sent)."""
    return side_rule(features, features.model, live, settings)


def test_an_agents_turn_is_no_side_request() -> None:
    assert rule(TURN, "agent", ON) is None
    assert rule(TURN, None, ON) is None  # tools: a turn of another agent too


def test_a_haiku_call_is_one_by_its_name_whatever_its_shape() -> None:
    haiku = replace(TURN, model="claude-haiku-4-5-20251001")
    assert rule(haiku, "agent", ON) == "model *-haiku-*"
    assert rule(replace(haiku, model="Claude-3-5-Haiku-20241022"), None, ON) is not None
    assert rule(haiku, "agent", ON.model_copy(update={"model_pattern": None})) is None


def test_the_shape_rules_each_a_setting() -> None:
    assert rule(TITLE, "agent", ON) == (
        "no tools, max_tokens <= 1024, not the live agent's session"
    )
    # The live agent's own toolless short request is not one, unless that rule is off.
    mine = replace(TITLE, session_key="agent")
    assert rule(mine, "agent", ON) is None
    assert rule(mine, "agent", ON.model_copy(update={"other_session": False})) is not None
    # A large max_tokens, or none given: not small.
    assert rule(replace(TITLE, max_tokens=4096), "agent", ON) is None
    assert rule(replace(TITLE, max_tokens=None), "agent", ON) is None
    assert rule(
        replace(TITLE, max_tokens=4096), "agent", ON.model_copy(update={"max_tokens": None})
    )
    # Tools offered: not one, unless that rule is off.
    tooled = replace(TITLE, has_tools=True)
    assert rule(tooled, "agent", ON) is None
    assert rule(tooled, "agent", ON.model_copy(update={"no_tools": False})) is not None
    # Every shape rule off and no name rule: nothing is a side request.
    off = SideRequestSettings(
        slot=1, model_pattern=None, max_tokens=None, no_tools=False, other_session=False
    )
    assert rule(TITLE, "agent", off) is None


def test_the_slot_each_request_gets() -> None:
    assert slot_of(True, 2, ON, busy=False) == 1 and slot_of(False, 2, ON, busy=False) == 0
    assert slot_of(True, 2, ON, busy=True) == 1  # a side request waits for its own slot
    assert slot_of(False, 2, ON, busy=True) is None  # a second turn: llama-server places it
    assert slot_of(True, 4, ON, busy=False) == 1
    assert slot_of(False, 4, ON, busy=False) is None  # llama-server chooses
    assert slot_of(True, 1, ON, busy=False) is None  # one slot: nothing to keep
    assert slot_of(True, 2, SideRequestSettings(), busy=False) is None  # no slot kept
    assert slot_of(True, 2, ON.model_copy(update={"slot": 2}), busy=False) is None  # no such slot


def test_the_slot_is_spliced_in_first_beside_the_depth() -> None:
    body = b' {"model": "m", "max_tokens": 8}'
    sent = with_integer(with_depth(body, 3), SLOT_KEY, 1)
    assert json.loads(sent) == {"id_slot": 1, "speculative.n_max": 3, "model": "m", "max_tokens": 8}
    assert json.loads(with_integer(b"{}", SLOT_KEY, 0)) == {"id_slot": 0}

"""A request that asks for logprobs, in any API's words, runs at depth 0 with reason logprobs
and teaches nothing; routing.logprobs_at_depth_zero = false turns the rule off."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis import Api
from proxy.config.routing import RoutingSettings
from proxy.routing.depth_clock import DepthRecord
from proxy.routing.features import extract_features
from proxy.routing.logprobs import asks_logprobs
from proxy.routing.router import Outcome, Router
from proxy.routing.telemetry import ParsedUsage
from tests.unit.test_router import _one_process_router, _router, _serving

QUIET = {"exploration_rate": 0.0, "cold_exploration_rate": 0.0}
ASKING: list[tuple[Api, dict[str, Any]]] = [
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}),
    ("chat", {"messages": [], "logprobs": True, "top_logprobs": 3}),
    ("completions", {"prompt": "hi", "logprobs": 2}),
    ("completions", {"prompt": "hi", "n_probs": 5}),  # /completion
    ("responses", {"input": "hi", "top_logprobs": 2}),
    ("responses", {"input": "hi", "include": ["message.output_text.logprobs"]}),
]
NOT_ASKING: list[tuple[Api, dict[str, Any]]] = [
    ("chat", {"messages": [{"role": "user", "content": "hi"}]}),
    ("chat", {"messages": [], "logprobs": False}),
    ("completions", {"prompt": "hi", "logprobs": 0, "n_probs": 0}),
    ("responses", {"input": "hi", "include": ["reasoning.encrypted_content"]}),
    ("messages", {"messages": [{"role": "user", "content": "hi"}]}),  # Anthropic has none
    ("chat", {"messages": [], "logprobs": "yes", "n_probs": None}),
]


@pytest.mark.parametrize(("api", "body"), ASKING + NOT_ASKING)
def test_every_apis_way_of_asking_for_logprobs(api: Api, body: dict[str, Any]) -> None:
    asking = (api, body) in ASKING
    assert asks_logprobs(body) is asking
    features = extract_features(
        api, {"model": "m", **body}, chars_per_token=4.0, session_header=None, pin_header=None
    )
    assert features.logprobs is asking


def _features(body: dict[str, Any], session: str = "s") -> Any:
    return extract_features(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": "hello " * 50}], **body},
        chars_per_token=4.0,
        session_header=session,
        pin_header=None,
    )


def _served(router: Router[Any], body: dict[str, Any], session: str = "s") -> Any:
    features = _features(body, session)
    route = router.route("m", features, exclude=())
    assert route is not None
    with _serving(router, route) as run:
        pass
    usage = ParsedUsage(has_timings=True, prompt_n=300, predicted_n=100, predicted_ms=2000.0)
    router.observe(Outcome(route, features, usage, 0.0, 3.0, run.record() or DepthRecord()))
    return route


def test_one_process_serves_logprobs_at_depth_zero_and_learns_nothing_from_it() -> None:
    router = _one_process_router(RoutingSettings(**QUIET))
    plain = router.route("m", _features({}), exclude=())
    assert plain is not None and plain.depth == 3  # the cold pick: the deepest
    routes = [_served(router, {"logprobs": True}, f"s{i}") for i in range(8)]
    assert {(r.depth, r.profile, r.reason) for r in routes} == {(0, "off", "logprobs")}
    assert "27972" in routes[0].detail
    assert router.stats.table() == []  # no sample of the class at depth 0
    assert router.mix[("m", "off", "logprobs")] == 8


def test_the_rule_turns_off() -> None:
    router = _one_process_router(RoutingSettings(**QUIET, logprobs_at_depth_zero=False))
    route = _served(router, {"logprobs": True})
    assert (route.depth, route.reason) == (3, "rule")
    assert router.stats.table() != []


def test_a_pool_sends_logprobs_to_the_off_profile_at_depth_zero() -> None:
    router = _router(RoutingSettings(**QUIET))
    route = _served(router, {"n_probs": 3})
    assert (route.backend.name, route.profile, route.depth, route.reason) == (
        "m/off",
        "off",
        0,
        "logprobs",
    )
    assert router.stats.table() == []
    # The off profile full: it runs where it is placed, at depth 0 still (a patched build).
    off = router.backends.get("m/off")
    assert off is not None
    off.in_flight = off.slots
    elsewhere = router.route("m", _features({"n_probs": 3}, "t"), exclude=())
    assert elsewhere is not None and elsewhere.profile != "off"
    assert (elsewhere.depth, elsewhere.reason) == (0, "logprobs")

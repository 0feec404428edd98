"""A backend's numbers are checked before they are learned: each impossible answer is dropped
with its reason, and no sequence of answers can make a learned cell negative, infinite or NaN."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass
from proxy.routing.depth_clock import DepthRecord
from proxy.routing.plausibility import implausible
from proxy.routing.router import Outcome
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation, ParsedUsage, make_observation
from tests.unit.test_router import _features, _one_process_router, _serving

SETTINGS = RoutingSettings()
CLS = RequestClass("<4k", "prose")


def _check(usage: ParsedUsage, depth: int | None = 3, total_s: float = 2.0) -> str | None:
    observation = make_observation(
        usage, backend="b", profile="max", request_class=CLS, sent_at=0.0, done_at=total_s
    )
    return implausible(usage, observation, depth, SETTINGS)


def _timings(**numbers: float) -> ParsedUsage:
    base: dict[str, float] = {
        "prompt_n": 500,
        "cache_n": 0,
        "predicted_n": 100,
        "prompt_ms": 100.0,
        "predicted_ms": 2000.0,
        "draft_n": 90,
        "draft_n_accepted": 60,
    }
    base.update(numbers)
    return ParsedUsage(has_timings=True, **base)  # type: ignore[arg-type]


def test_a_real_run_is_plausible() -> None:
    assert _check(_timings()) is None
    assert _check(_timings(draft_n=0, draft_n_accepted=0), depth=0) is None
    assert _check(ParsedUsage(input_tokens=500, output_tokens=100)) is None  # usage only


@pytest.mark.parametrize(
    ("numbers", "reason"),
    [
        ({"prompt_n": -1}, "negative"),
        ({"cache_n": -5}, "negative"),
        ({"predicted_ms": -3.0}, "negative"),
        ({"draft_n_accepted": -1}, "negative"),
        ({"predicted_ms": 1e-200}, "too_fast"),  # ~1e205 tok/s
        ({"predicted_ms": 1.0}, "too_fast"),  # 100,000 tok/s
        ({"prompt_ms": 1e-6}, "too_fast"),  # 5e11 tok/s of prefill
        ({"predicted_ms": math.nan}, "non_finite"),
        ({"prompt_ms": math.inf}, "non_finite"),
        ({"draft_n": 301}, "drafts"),  # 100 tokens at depth 3 draft at most 300
        ({"draft_n": 50, "draft_n_accepted": 51}, "drafts"),
    ],
)
def test_an_impossible_number_names_its_reason(numbers: dict[str, float], reason: str) -> None:
    assert _check(_timings(**numbers)) == reason


def test_drafts_at_depth_zero_and_usage_only_numbers_are_checked_too() -> None:
    assert _check(_timings(), depth=0) == "drafts"
    assert _check(_timings(), depth=None) is None  # a pool backend's depth is not known here
    assert _check(ParsedUsage(input_tokens=-1, output_tokens=5)) == "negative"
    assert _check(ParsedUsage(input_tokens=10, cached_tokens=20, output_tokens=5)) == "negative"
    # 10^9 tokens in 2 s is no decode any hardware does, whatever the prefill took.
    assert _check(ParsedUsage(input_tokens=10, output_tokens=10**9)) == "too_fast"


def test_the_speed_bound_is_a_setting() -> None:
    usage = _timings(predicted_ms=10.0)  # 10,000 tok/s
    observation = make_observation(
        usage, backend="b", profile="max", request_class=CLS, sent_at=0.0, done_at=1.0
    )
    assert implausible(usage, observation, 3, SETTINGS) is None
    slow = RoutingSettings(max_decode_tok_s=5000.0)
    assert implausible(usage, observation, 3, slow) == "too_fast"


def test_the_router_learns_nothing_from_a_dropped_answer_and_says_why() -> None:
    router = _one_process_router(RoutingSettings(exploration_rate=0.0, cold_exploration_rate=0.0))
    features = _features("a")
    good, bad = _timings(draft_n=0, draft_n_accepted=0), _timings(predicted_ms=1e-200)
    observed = []
    for usage in (good, bad, _timings(prompt_n=-7), good):
        route = router.route("m", features, exclude=())
        assert route is not None
        with _serving(router, route) as run:
            pass
        outcome = Outcome(route, features, usage, 0.0, 3.0, run.record())
        observed.append(router.observe(outcome))
    assert [o.dropped for o in observed] == [None, "too_fast", "negative", None]
    assert observed[1].decode_tok_s is None and observed[2].context_tokens is None
    rows = router.stats.table()
    assert sum(float(r["weight"]) for r in rows) == pytest.approx(2.0, rel=0.1)
    assert all(r["decode_tok_s"] == 50.0 for r in rows)


def _random_usage(rng: random.Random) -> ParsedUsage:
    """Numbers a hostile or broken backend might send: huge, tiny, negative, zero."""

    def number() -> float:
        return rng.choice([0, 1, -1, 7, 1e-200, 1e-9, 1e9, 1e200, 2**63, rng.uniform(0, 1e4)])

    if rng.random() < 0.5:
        return ParsedUsage(
            has_timings=True,
            prompt_n=int(number()),
            cache_n=int(number()),
            predicted_n=int(number()),
            prompt_ms=number(),
            predicted_ms=number(),
            draft_n=int(number()),
            draft_n_accepted=int(number()),
        )
    return ParsedUsage(
        input_tokens=int(number()),
        cached_tokens=int(number()),
        output_tokens=int(number()),
        first_token_at=number() if rng.random() < 0.5 else None,
        last_token_at=number() if rng.random() < 0.5 else None,
    )


def test_no_answer_makes_a_learned_cell_negative_infinite_or_nan(tmp_path: Path) -> None:
    rng = random.Random(7)
    router = _one_process_router(RoutingSettings())
    for i in range(3000):
        features = _features(f"s{i % 5}", tokens=rng.choice([100, 5000, 40000]))
        route = router.route("m", features, exclude=())
        assert route is not None
        done_at = rng.choice([1e-9, 0.001, 1.0, 50.0])
        outcome = Outcome(route, features, _random_usage(rng), 0.0, done_at, DepthRecord())
        router.observe(outcome)
    assert sum(float(r["weight"]) for r in router.stats.table()) > 10  # some were learned
    path = tmp_path / "learned.json"
    router.stats.save(path)
    json.loads(path.read_bytes(), parse_constant=lambda c: pytest.fail(f"{c} in the file"))
    again = LearnedStats.load(path, router.settings)
    assert "dropped" not in again.load_report and not (tmp_path / "learned.json.rejected").exists()
    for row in router.stats.table():
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value) and value >= 0, (key, row)


def test_a_dropped_observation_keeps_no_number_of_the_backend() -> None:
    observation = Observation("b", "max", CLS, 10, 0, 5, 1, 1, math.inf, 1.0, 1.0, 2.0, "timings")
    usage = ParsedUsage(has_timings=True, predicted_n=5, predicted_ms=0.0)
    assert implausible(usage, observation, 3, SETTINGS) == "non_finite"

"""The depth a backend runs now (proxy/observability/depth_now.py): decoding now, else its last
request's; an answer on a one-slot process, which is never busy."""

from __future__ import annotations

from proxy.observability.depth_now import DepthNow, depth_now
from proxy.observability.recent import Finished

DEPTHS = {"off": 0, "min": 2, "max": 3}


def finished(profile: str | None, depth: int | None, at: float = 100.0) -> Finished:
    return Finished(1, at, "id", "chat", "m", 200, 1.0, profile=profile, depth=depth)


def test_the_request_decoding_now_gives_the_depth() -> None:
    assert depth_now({"min": 1}, DEPTHS, finished("max", 3)) == DepthNow(2, "decoding", "min")


def test_several_depths_decoding_at_once_give_the_deepest() -> None:
    now = depth_now({"off": 2, "max": 1}, DEPTHS, None)
    assert now == DepthNow(3, "decoding", "max")


def test_idle_it_is_the_last_request_s_depth() -> None:
    """A one-slot process between two requests: the one it served last, and when."""
    assert depth_now({}, DEPTHS, finished("max", 3, at=42.0)) == DepthNow(3, "last", "max", 42.0)
    assert depth_now({}, DEPTHS, finished("max", 5)) == DepthNow(5, "last", "max", 100.0)


def test_nothing_served_yet_is_no_answer() -> None:
    assert depth_now({}, DEPTHS, None) is None
    assert depth_now({}, DEPTHS, finished(None, None)) is None  # refused before routing
    assert depth_now({}, DEPTHS, finished("client", None)) is None  # a value that is no depth


def test_a_pool_process_runs_its_profile() -> None:
    assert depth_now({"min": 1}, DEPTHS, None, pool_profile="min") == DepthNow(2, "pool", "min")

"""The live page's memory of finished requests (proxy/observability/recent.py): a bounded ring read
by sequence number, the last request of each backend, and the chart per depth."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace
from typing import Any, cast

from proxy.observability.recent import Finished, RecentRequests, as_json
from proxy.routing.classes import RequestClass
from proxy.routing.router import Route
from proxy.routing.telemetry import Observation


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def route(
    backend: str = "m/one-process", profile: str = "max", depth: int | None = 3, level: int = 2
) -> Route:
    fake = SimpleNamespace(
        backend=SimpleNamespace(name=backend),
        profile=profile,
        reason="busy",
        detail=f"busy epoch of {backend} at {profile}",
        class_label="<4k/code",
        depth=depth,
        level=level,
        in_flight=level - 1,
    )
    return cast(Route, fake)


def observation(speed: float = 50.0, drafted: int = 10, accepted: int = 8) -> Observation:
    return Observation(
        backend="m/one-process",
        profile="max",
        request_class=RequestClass("<4k", "code"),
        context_tokens=900,
        cached_tokens=800,
        output_tokens=120,
        draft_n=drafted,
        draft_n_accepted=accepted,
        decode_tok_s=speed,
        prefill_s=0.1,
        ttft_s=0.2,
        total_s=2.5,
        source="timings",
    )


def record(recent: RecentRequests, n: int = 1, **overrides: Any) -> None:
    for i in range(n):
        recent.record(
            f"id-{i}",
            "chat",
            "m",
            overrides.get("status", 200),
            2.5,
            True,
            overrides.get("route", route()),
            overrides.get("observation", observation()),
            session_key=overrides.get("session_key", "a-very-long-session-key-of-an-agent"),
            own_depth=overrides.get("own_depth", False),
            client_depth=overrides.get("client_depth"),
            sent_model=overrides.get("sent_model"),
        )


def test_a_finished_request_keeps_what_the_page_shows() -> None:
    recent = RecentRequests(10, clock=Clock())
    record(recent)
    (row,) = recent.after(0, 100)
    assert row.seq == recent.last_seq == 1 and row.at == 1_000_000.0
    assert (row.request_id, row.api, row.model, row.status, row.stream) == (
        "id-0",
        "chat",
        "m",
        200,
        True,
    )
    assert (row.backend, row.request_class, row.profile, row.depth) == (
        "m/one-process",
        "<4k/code",
        "max",
        3,
    )
    assert (row.level, row.others, row.sent_model) == (2, 1, None)
    assert (row.reason, row.detail) == ("busy", "busy epoch of m/one-process at max")
    assert (row.prompt_tokens, row.cached_tokens, row.output_tokens) == (900, 800, 120)
    assert (row.drafted, row.accepted, row.decode_tok_s, row.ttft_s) == (10, 8, 50.0, 0.2)
    assert row.session == "a-very-long-sess"  # the first 16 characters
    assert recent.last_of_backend == {"m/one-process": row}


def test_the_ring_keeps_the_newest_and_reads_after_a_sequence_number() -> None:
    recent = RecentRequests(5, clock=Clock())
    record(recent, 12)
    assert [r.seq for r in recent.after(0, 100)] == [8, 9, 10, 11, 12]  # the oldest went
    assert [r.seq for r in recent.after(10, 100)] == [11, 12]
    assert [r.seq for r in recent.after(0, 2)] == [11, 12]  # the newest of what is asked
    assert recent.after(12, 100) == []
    assert recent.capacity == 5


def test_appending_takes_no_memory_once_the_ring_is_full() -> None:
    """O(1): the ring never grows past its capacity, whatever went through it."""
    recent = RecentRequests(100, clock=Clock())
    record(recent, 200)  # full, and the chart step exists
    tracemalloc.start()
    try:
        record(recent, 100)
        first, _ = tracemalloc.get_traced_memory()
        record(recent, 1000)
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(recent.after(0, 10_000)) == 100
    assert second - first < 2_000, (first, second)  # no growth per request, only noise


def test_unrouted_and_client_depth_requests() -> None:
    recent = RecentRequests(10, clock=Clock())
    recent.record("x", "chat", "none", 404, 0.001, False, None, None, error="unknown model")
    record(recent, own_depth=True)  # a value that is no depth
    record(recent, own_depth=True, client_depth=5, sent_model="claude-haiku-4-5")
    refused, own, five = recent.after(0, 10)
    assert (refused.profile, refused.backend, refused.error) == (None, None, "unknown model")
    assert own.client_depth and own.depth is None  # not the router's depth, and not a depth
    assert five.client_depth and five.depth == 5  # the depth it ran at: the client's own
    assert (five.sent_model, own.sent_model) == ("claude-haiku-4-5", None)
    depths = {"m": {"off": 0, "max": 3}}
    assert as_json(own, depths)["depth"] is None
    pool = own._replace(client_depth=False, depth=None)
    assert as_json(pool, depths)["depth"] == 3  # a pool process: its profile's depth
    assert recent.chart()["lines"] == []  # neither counts in the chart


def test_the_chart_sums_each_step_per_model_and_profile() -> None:
    clock = Clock(1_000_000.0)
    recent = RecentRequests(100, window_s=60, step_s=10, clock=clock)
    record(recent, observation=observation(40.0, 10, 5))
    record(recent, observation=observation(60.0, 30, 27))
    clock.now += 10
    record(recent, route=route(profile="off", depth=0), observation=observation(30.0, 0, 0))
    record(recent, status=500)  # failures are no speed
    (max_line, off_line) = sorted(recent.chart()["lines"], key=lambda line: line["profile"])
    assert (max_line["model"], max_line["profile"], max_line["level"]) == ("m", "max", 2)
    assert max_line["points"] == [
        {"at": 1_000_000, "requests": 2, "decode_tok_s": 50.0, "acceptance": 0.8},
    ]
    assert off_line["points"] == [
        {"at": 1_000_010, "requests": 1, "decode_tok_s": 30.0, "acceptance": None},
    ]
    clock.now += 70  # past the window: the points are gone
    assert recent.chart()["lines"] == []


def test_backends_that_are_gone_are_forgotten() -> None:
    recent = RecentRequests(10, clock=Clock())
    record(recent, route=route(backend="m/a"))
    record(recent, route=route(backend="m/b"))
    recent.forget_backends({"m/b"})
    assert set(recent.last_of_backend) == {"m/b"}


def test_a_row_is_a_plain_tuple() -> None:
    assert issubclass(Finished, tuple)  # one allocation per request, no per-row dict


def test_the_chart_never_draws_one_depth_alone_and_busy_as_one_line() -> None:
    """max measured alone and off measured beside others are two loads: each its own line,
    labelled with its level, so no line sets a busy off beside an alone max."""
    recent = RecentRequests(100, window_s=60, step_s=10, clock=Clock())
    record(recent, route=route(profile="max", level=1), observation=observation(70.0))
    record(recent, route=route(profile="max", level=2), observation=observation(40.0))
    record(recent, route=route(profile="off", depth=0, level=2), observation=observation(45.0))
    lines = {(line["profile"], line["level"]): line["points"] for line in recent.chart()["lines"]}
    assert set(lines) == {("max", 1), ("max", 2), ("off", 2)}
    assert lines["max", 1][0]["decode_tok_s"] == 70.0 and lines["max", 2][0]["decode_tok_s"] == 40.0

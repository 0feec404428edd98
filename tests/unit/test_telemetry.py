"""Telemetry parsing for each API, stream and not, chunk splits anywhere, /metrics counters."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from proxy.apis import Api
from proxy.routing.classes import RequestClass
from proxy.routing.telemetry import (
    ParsedUsage,
    SpecCounters,
    StreamTelemetry,
    make_observation,
    parse_body,
    parse_spec_counters,
)

TIMINGS = {
    "cache_n": 100,
    "prompt_n": 34,
    "prompt_ms": 2.993,
    "prompt_per_token_ms": 0.088,
    "prompt_per_second": 11359.8,
    "predicted_n": 128,
    "predicted_ms": 53.056,
    "predicted_per_token_ms": 0.418,
    "predicted_per_second": 2393.7,
    "draft_n": 95,
    "draft_n_accepted": 80,
}
NO_DRAFT = {k: v for k, v in TIMINGS.items() if not k.startswith("draft")}
OAI_USAGE = {
    "completion_tokens": 128,
    "prompt_tokens": 134,
    "total_tokens": 262,
    "prompt_tokens_details": {"cached_tokens": 100},
}
CLS = RequestClass("<4k", "prose")


def sse(*events: Any, crlf: bool = False) -> bytes:
    """data: events; an (event_name, payload) tuple adds an event: line (Responses/Anthropic)."""
    out = []
    for ev in events:
        if isinstance(ev, tuple):
            name, payload = ev
            out.append(f"event: {name}\ndata: {json.dumps(payload)}\n\n")
        elif ev == "[DONE]":
            out.append("data: [DONE]\n\n")
        else:
            out.append(f"data: {json.dumps(ev)}\n\n")
    text = "".join(out)
    return (text.replace("\n", "\r\n") if crlf else text).encode()


def chunk(i: int, content: str = "tok", **extra: Any) -> dict[str, Any]:
    return {
        "choices": [{"finish_reason": None, "index": 0, "delta": {"content": content}}],
        "id": f"c{i}",
        "object": "chat.completion.chunk",
        **extra,
    }


def chat_stream(*, include_usage: bool = False, per_token: bool = False, n: int = 5) -> bytes:
    events: list[Any] = [{"choices": [{"delta": {"role": "assistant", "content": None}}]}]
    for i in range(n):
        extra: dict[str, Any] = {"timings": dict(TIMINGS, predicted_n=i + 1)} if per_token else {}
        events.append(chunk(i, **extra))
    final: dict[str, Any] = {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}]}
    if include_usage:
        events.append(final)
        final = {"choices": [], "usage": OAI_USAGE}
    final["timings"] = TIMINGS
    events += [final, "[DONE]"]
    return sse(*events)


def feed_split(api: Api, data: bytes, cuts: list[int]) -> ParsedUsage:
    tel = StreamTelemetry(api)
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        tel.feed(data[start:cut])
        start = cut
    return tel.result(clock=10.0)


def assert_timings(u: ParsedUsage) -> None:
    assert u.has_timings
    assert (u.prompt_n, u.cache_n, u.predicted_n) == (34, 100, 128)
    assert u.prompt_ms == pytest.approx(2.993)
    assert u.predicted_ms == pytest.approx(53.056)
    assert (u.draft_n, u.draft_n_accepted) == (95, 80)


# --- non-stream bodies --------------------------------------------------------------------


def test_chat_body_with_timings() -> None:
    body = {"choices": [{"message": {"content": "hi"}}], "usage": OAI_USAGE, "timings": TIMINGS}
    u = parse_body("chat", json.dumps(body).encode())
    assert_timings(u)
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (134, 100, 128)


def test_completions_body_without_drafts_means_zero_drafted() -> None:
    body = {"choices": [{"text": "hi"}], "usage": OAI_USAGE, "timings": NO_DRAFT}
    u = parse_body("completions", json.dumps(body).encode())
    assert u.has_timings
    assert (u.draft_n, u.draft_n_accepted) == (0, 0)


def test_responses_body_has_usage_only() -> None:
    body = {
        "object": "response",
        "output": [],
        "usage": {
            "input_tokens": 500,
            "output_tokens": 40,
            "total_tokens": 540,
            "input_tokens_details": {"cached_tokens": 450},
        },
    }
    u = parse_body("responses", json.dumps(body).encode())
    assert not u.has_timings
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (500, 450, 40)


def test_messages_body_adds_cache_reads_to_input() -> None:
    body = {
        "type": "message",
        "content": [],
        "usage": {"cache_read_input_tokens": 900, "input_tokens": 100, "output_tokens": 64},
    }
    u = parse_body("messages", json.dumps(body).encode())
    assert not u.has_timings
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (1000, 900, 64)


def test_anthropic_delta_repeating_input_tokens_keeps_cache_reads() -> None:
    start = {
        "type": "message_start",
        "message": {
            "usage": {"cache_read_input_tokens": 900, "input_tokens": 100, "output_tokens": 1}
        },
    }
    delta = {"type": "message_delta", "usage": {"input_tokens": 100, "output_tokens": 30}}
    data = sse(("message_start", start), ("message_delta", delta))
    u = feed_split("messages", data, [])
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (1000, 900, 30)


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"[1,2]", b'{"usage": 5, "timings": []}', b"[" * 100_000]
)
def test_unreadable_body_yields_empty_usage(raw: bytes) -> None:
    assert parse_body("chat", raw) == ParsedUsage()


# --- streams ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["final", "include_usage", "per_token"])
def test_chat_stream_split_at_every_byte(variant: str) -> None:
    data = chat_stream(include_usage=variant == "include_usage", per_token=variant == "per_token")
    whole = feed_split("chat", data, [])
    assert_timings(whole)
    assert whole.events == 8 + (variant == "include_usage")
    for cut in range(1, len(data)):
        assert feed_split("chat", data, [cut]) == whole
    if variant == "include_usage":
        assert (whole.input_tokens, whole.output_tokens) == (134, 128)


def test_chat_stream_random_multi_splits_and_crlf() -> None:
    rnd = random.Random(7)
    data = chat_stream(per_token=True, n=40)
    expected = feed_split("chat", data, [])
    crlf = data.replace(b"\n", b"\r\n")
    for _ in range(200):
        cuts = rnd.sample(range(1, len(data)), 12)
        assert feed_split("chat", data, cuts) == expected
        crlf_cuts = rnd.sample(range(1, len(crlf)), 12)
        assert feed_split("chat", crlf, crlf_cuts) == expected


def test_one_byte_chunks() -> None:
    data = chat_stream(include_usage=True)
    assert feed_split("chat", data, list(range(1, len(data)))) == feed_split("chat", data, [])


def test_stream_cut_before_the_last_blank_line_still_parses() -> None:
    data = sse(chunk(0), {"choices": [], "timings": TIMINGS}).rstrip(b"\n")
    assert_timings(feed_split("completions", data, [10]))


def test_responses_stream_timings_on_completed_event() -> None:
    done = {
        "type": "response.completed",
        "response": {
            "object": "response",
            "usage": {
                "input_tokens": 134,
                "output_tokens": 128,
                "total_tokens": 262,
                "input_tokens_details": {"cached_tokens": 100},
            },
        },
        "timings": TIMINGS,
    }
    data = sse(
        ("response.created", {"type": "response.created", "response": {"status": "in_progress"}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "a"}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "b"}),
        ("response.completed", done),
    )
    for cut in range(1, len(data), 7):
        u = feed_split("responses", data, [cut])
        assert_timings(u)
        assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (134, 100, 128)


def anthropic_stream(n: int) -> bytes:
    start = {
        "type": "message_start",
        "message": {
            "id": "m",
            "content": [],
            "usage": {"cache_read_input_tokens": 900, "input_tokens": 100, "output_tokens": 0},
        },
    }
    events: list[Any] = [
        ("message_start", start),
        ("content_block_start", {"type": "content_block_start", "index": 0}),
    ]
    for _ in range(n):
        events.append(
            (
                "content_block_delta",
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}},
            )
        )
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": n},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return sse(*events)


def test_anthropic_stream_usage_and_clock() -> None:
    data = anthropic_stream(21)
    lines = data.split(b"\n\n")
    tel = StreamTelemetry("messages")
    for i, line in enumerate(lines):
        tel.feed(line + b"\n\n" if i < len(lines) - 1 else line, now=1.0 + 0.05 * i)
    u = tel.result(clock=99.0)
    assert not u.has_timings
    assert (u.input_tokens, u.cached_tokens, u.output_tokens) == (1000, 900, 21)
    assert u.first_token_at == pytest.approx(1.0)
    assert u.last_token_at == pytest.approx(1.0 + 0.05 * (len(lines) - 1))
    obs = make_observation(
        u, backend="b", profile="max", request_class=CLS, sent_at=0.5, done_at=3.0
    )
    assert obs.source == "usage+clock"
    assert obs.ttft_s == pytest.approx(0.5)
    assert obs.context_tokens == 1000
    assert obs.prefill_tokens == 100
    assert u.last_token_at is not None
    assert obs.decode_tok_s == pytest.approx(20 / (u.last_token_at - 1.0))
    assert obs.draft_n is None and obs.acceptance is None


def test_mark_first_token_earliest_wins() -> None:
    tel = StreamTelemetry("chat")
    tel.feed(b"data: {}\n\n", now=5.0)
    tel.mark_first_token(4.0)
    tel.mark_first_token(6.0)
    assert tel.result(clock=9.0).first_token_at == 4.0


def test_non_sse_garbage_never_raises_and_stays_bounded() -> None:
    tel = StreamTelemetry("chat")
    for _ in range(40):
        tel.feed(b"x" * 1_000_000)
    tel.feed(b'data: {"timings": [broken\n\n')
    assert tel.result(clock=1.0) == ParsedUsage(last_token_at=1.0)


# --- observations ------------------------------------------------------------------------


def test_observation_from_timings() -> None:
    u = parse_body("chat", json.dumps({"timings": TIMINGS, "usage": OAI_USAGE}).encode())
    obs = make_observation(
        u, backend="b1", profile="max", request_class=CLS, sent_at=1.0, done_at=1.5
    )
    assert obs.source == "timings"
    assert obs.context_tokens == 134
    assert obs.cached_tokens == 100
    assert obs.prefill_tokens == 34
    assert obs.output_tokens == 128
    assert obs.decode_tok_s == pytest.approx(128 / 0.053056)
    assert obs.prefill_s == pytest.approx(0.002993)
    assert obs.acceptance == pytest.approx(80 / 95)
    assert obs.total_s == pytest.approx(0.5)
    assert obs.ttft_s is None  # not a stream


def test_observation_with_metrics_delta() -> None:
    u = parse_body(
        "messages", json.dumps({"usage": {"input_tokens": 10, "output_tokens": 50}}).encode()
    )
    delta = SpecCounters(400, 300, 150) - SpecCounters(100, 60, 50)
    obs = make_observation(
        u, backend="b", profile="min", request_class=CLS, sent_at=0.0, done_at=2.0, spec_delta=delta
    )
    assert (obs.draft_n, obs.draft_n_accepted) == (300, 240)
    assert obs.acceptance == pytest.approx(0.8)
    reset = SpecCounters(5, 5, 5) - SpecCounters(100, 60, 50)  # backend restarted meanwhile
    obs = make_observation(
        u, backend="b", profile="min", request_class=CLS, sent_at=0.0, done_at=2.0, spec_delta=reset
    )
    assert obs.draft_n is None


def test_a_request_alone_takes_its_decode_speed_from_the_backends_clock() -> None:
    """Anthropic Messages carry no timings: the proxy's clock saw 49 tokens in 1.5 s (32.7
    tok/s, the relay's jitter included); the backend's own counters say 50 in 1.25 s."""
    u = parse_body(
        "messages", json.dumps({"usage": {"input_tokens": 10, "output_tokens": 50}}).encode()
    )
    u = replace(u, first_token_at=0.5, last_token_at=2.0)
    before = SpecCounters(100, 60, 50, predicted_tokens=1000, predicted_seconds=40.0)
    after = SpecCounters(400, 300, 150, predicted_tokens=1050, predicted_seconds=41.25)
    clock = make_observation(
        u, backend="b", profile="min", request_class=CLS, sent_at=0.0, done_at=2.0
    )
    assert clock.decode_tok_s == pytest.approx(49 / 1.5)
    exact = make_observation(
        u,
        backend="b",
        profile="min",
        request_class=CLS,
        sent_at=0.0,
        done_at=2.0,
        spec_delta=after - before,
    )
    assert exact.decode_tok_s == pytest.approx(40.0)
    no_clock = SpecCounters(400, 300, 150) - SpecCounters(100, 60, 50)  # an older build
    older = make_observation(
        u,
        backend="b",
        profile="min",
        request_class=CLS,
        sent_at=0.0,
        done_at=2.0,
        spec_delta=no_clock,
    )
    assert older.decode_tok_s == pytest.approx(49 / 1.5)


# --- /metrics ---------------------------------------------------------------------------------

METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 300
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: accepted
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 270
# HELP llamacpp:spec_decode_num_drafts_total Speculative: verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 102
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 102
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 98
"""


def test_parse_spec_counters() -> None:
    assert parse_spec_counters(METRICS) == SpecCounters(300, 270, 102)
    clock = "llamacpp:tokens_predicted_total 777\nllamacpp:tokens_predicted_seconds_total 12.5\n"
    assert parse_spec_counters(METRICS + clock) == SpecCounters(300, 270, 102, 777, 12.5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "llamacpp:prompt_tokens_total 5\n",
        "this is { not prometheus\n",
        METRICS.replace("llamacpp:spec_decode_num_drafts_total 102", ""),
    ],
)
def test_parse_spec_counters_missing(text: str) -> None:
    assert parse_spec_counters(text) is None

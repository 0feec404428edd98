"""What the proxy keeps of a complete answer (proxy.serving.forward.KeptBody): the whole body
while small; past that its tail only, and from it the top-level usage and timings."""

from __future__ import annotations

import json

import pytest

from proxy.routing.telemetry import parse_body
from proxy.serving.forward import KeptBody

USAGE = {"completion_tokens": 7, "prompt_tokens": 5, "total_tokens": 12}
TIMINGS = {"predicted_n": 7, "predicted_ms": 70.0, "prompt_n": 5, "prompt_ms": 5.0}


def answer(content: str) -> bytes:
    """A chat answer as llama-server writes it: keys sorted, usage and timings last."""
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        "model": "m",
        "timings": TIMINGS,
        "usage": USAGE,
    }
    return json.dumps(body, sort_keys=True).encode()


def kept(data: bytes, step: int) -> KeptBody:
    body = KeptBody()
    for i in range(0, len(data), step):
        body.feed(data[i : i + step])
    return body


def test_a_small_answer_is_kept_whole() -> None:
    data = answer("hello")
    assert kept(data, 3).result() == data


@pytest.mark.parametrize("step", [1000, 65536, 1 << 20])
def test_a_large_answer_keeps_its_tail_and_its_usage(step: int) -> None:
    # The content mentions the keys, as text: quoted inside a string, never taken for them.
    decoy = ' "usage": {"completion_tokens": 999}, "timings": {"predicted_n": 999} '
    data = answer(decoy + "x" * (3 << 20) + decoy)
    body = kept(data, step)
    assert len(body.result()) < 1024
    usage = parse_body("chat", body.result())
    assert (usage.output_tokens, usage.input_tokens, usage.predicted_n) == (7, 5, 7)


def test_held_gives_up_what_was_held_and_keeps_the_tail_from_there() -> None:
    body = KeptBody()
    first = b"a" * (KeptBody.WHOLE + 1)
    assert body.feed(first) is False
    assert body.held() == first
    assert body.feed(answer("end")) is False  # from now on only the tail
    assert parse_body("chat", body.result()).output_tokens == 7


def test_a_large_body_without_usage_gives_an_empty_document() -> None:
    assert kept(b"[" + b"1," * (1 << 20) + b"1]", 65536).result() == b"{}"

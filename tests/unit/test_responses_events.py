"""The Responses event indexer on llama-server's own bytes (keys sorted, as nlohmann::json writes
them): a reasoning item, a message and a function call, cut into chunks at awkward places."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.serving.responses_events import ResponsesEventIndexer


def ev(kind: str, **fields: Any) -> bytes:
    data = json.dumps({"type": f"response.{kind}", **fields}, sort_keys=True, separators=(",", ":"))
    return f"event: response.{kind}\ndata: {data}\n\n".encode()


MSG, RS, FC = {"item_id": "msg_1"}, {"item_id": "rs_1"}, {"item_id": "fc_1"}
STREAM = b"".join(
    [
        ev("created", response={"id": "r", "object": "response", "status": "in_progress"}),
        ev("output_item.added", item={"id": "rs_1", "type": "reasoning", "content": []}),
        ev("reasoning_text.delta", **RS, delta="hmm"),
        ev("output_item.added", item={"id": "msg_1", "type": "message", "content": []}),
        ev("content_part.added", **MSG, part={"type": "output_text", "text": ""}),
        ev("output_text.delta", **MSG, delta='say "hi"\n\n'),
        ev("output_text.delta", **MSG, delta="!"),
        ev("output_item.added", item={"id": "fc_1", "type": "function_call", "arguments": ""}),
        ev("function_call_arguments.delta", **FC, delta="{}"),
        ev("output_item.done", item={"id": "rs_1", "type": "reasoning"}),
        ev("output_text.done", **MSG, text='say "hi"\n\n!'),
        ev("content_part.done", **MSG, part={"type": "output_text"}),
        ev("output_item.done", item={"id": "msg_1", "type": "message"}),
        ev("output_item.done", item={"id": "fc_1", "type": "function_call"}),
        ev("completed", response={"id": "r", "output": [1]}, timings={"predicted_n": 3}),
    ]
)
EXPECTED = [  # (type, output_index, content_index) where the spec has them
    ("response.created", None, None),
    ("response.output_item.added", 0, None),
    ("response.reasoning_text.delta", 0, 0),
    ("response.output_item.added", 1, None),
    ("response.content_part.added", 1, 0),
    ("response.output_text.delta", 1, 0),
    ("response.output_text.delta", 1, 0),
    ("response.output_item.added", 2, None),
    ("response.function_call_arguments.delta", 2, None),
    ("response.output_item.done", 0, None),
    ("response.output_text.done", 1, 0),
    ("response.content_part.done", 1, 0),
    ("response.output_item.done", 1, None),
    ("response.output_item.done", 2, None),
    ("response.completed", None, None),
]


def parse(stream: bytes) -> list[dict[str, Any]]:
    events = []
    for block in stream.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            parsed = json.loads(data.removeprefix("data: "))
            assert name == f"event: {parsed['type']}"
            events.append(parsed)
    return events


@pytest.mark.parametrize("size", [len(STREAM), 1, 7, 64])
def test_indices_and_sequence_whatever_the_chunking(size: int) -> None:
    indexer = ResponsesEventIndexer("local-model")
    out = b"".join(indexer.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
    out += indexer.flush()
    events = parse(out)
    assert [(e["type"], e.get("output_index"), e.get("content_index")) for e in events] == EXPECTED
    assert [e["sequence_number"] for e in events] == list(range(len(EXPECTED)))
    created, completed = events[0]["response"], events[-1]["response"]
    assert (created["model"], created["output"]) == ("local-model", [])
    assert isinstance(created["created_at"], int)
    assert completed["output"] == [1] and events[-1]["timings"] == {"predicted_n": 3}  # kept
    assert events[5]["delta"] == 'say "hi"\n\n' and events[5]["logprobs"] == []


def test_fields_already_there_are_kept_and_other_bytes_pass() -> None:
    indexer = ResponsesEventIndexer("m")
    indices = {"sequence_number": 41, "output_index": 3, "content_index": 2}
    given = ev("output_text.delta", item_id="x", delta="a", **indices)
    (parsed,) = parse(indexer.feed(given))
    assert (parsed["sequence_number"], parsed["output_index"], parsed["content_index"]) == (
        41,
        3,
        2,
    )
    untyped = b'data: {"type":"error"}\n\n: a comment\n\n'
    assert indexer.feed(untyped) == untyped
    assert indexer.feed(b"event: response.completed\ndata: {") == b""
    assert indexer.flush() == b"event: response.completed\ndata: {"  # a cut stream ends as it was


def crlf(stream: bytes) -> bytes:
    return stream.replace(b"\n", b"\r\n")


@pytest.mark.parametrize("size", [1, 2, 7, 64, 1 << 20])
def test_any_valid_sse_is_read_crlf_comments_and_no_space_included(size: int) -> None:
    """The same events written as SSE allows: CRLF line ends (cut between CR and LF by the
    chunking too), a comment line inside an event, `field:value` without the space, a
    keep-alive comment between events. Each is indexed as the plain stream's is."""
    events = STREAM.split(b"\n\n")[:-1]
    varied = [
        (b": keep-alive\n" + e) if i % 3 == 0 else e.replace(b"data: ", b"data:")
        for i, e in enumerate(events)
    ]
    stream = crlf(b"\n\n".join(varied) + b"\n\n: ping\n\n")
    indexer = ResponsesEventIndexer("local-model")
    out = b"".join(indexer.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    out += indexer.flush()
    assert b"\r" not in out
    blocks = [b for b in out.split(b"\n\n") if b]
    assert blocks[-1] == b": ping"  # a comment passes as it is
    typed = [b"\n".join(x for x in b.split(b"\n") if not x.startswith(b":")) for b in blocks[:-1]]
    events_out = parse(b"\n\n".join(typed) + b"\n\n")
    assert [(e["type"], e.get("output_index"), e.get("content_index")) for e in events_out] == (
        EXPECTED
    )
    assert [e["sequence_number"] for e in events_out] == list(range(len(EXPECTED)))
    assert sum(b.startswith(b": keep-alive\n") for b in blocks) == len(range(0, len(events), 3))


def test_an_event_that_cannot_be_completed_passes_unchanged() -> None:
    """Data nested deeper than orjson writes (255 levels), or an event name that is not UTF-8:
    passed as they came, and the next events still get their numbers (before, the first one
    raised mid-stream)."""
    indexer = ResponsesEventIndexer("m")
    deep = b'event: response.output_text.delta\ndata: {"x":' + b"[" * 300 + b"]" * 300 + b"}\n\n"
    odd = b'event: response.\xff\ndata: {"type":"x"}\n\n'
    after = ev("output_text.delta", item_id="x", delta="a")
    out = indexer.feed(deep + odd + after)
    assert out.startswith(deep + odd)
    (parsed,) = parse(out[len(deep + odd) :])
    assert parsed["sequence_number"] == 0

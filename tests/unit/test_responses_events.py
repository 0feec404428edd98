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

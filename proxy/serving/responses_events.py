"""Completing llama-server's `/v1/responses` stream events with the fields the spec requires.

llama-server's Responses stream lacks `sequence_number` on every event, `output_index` and
`content_index` on the item and part events, and `created_at`/`model`/`output` on the response
of `response.created`. The openai SDK's `responses.stream()` helper indexes its snapshot with
them (it raises without), and the AI SDK's `@ai-sdk/openai` provider (opencode) validates them.

Cost: each event is parsed and written back with orjson (one C call each way): on token deltas about
as fast as splicing the fields in with Python byte operations, and simpler. Only the Responses API
is touched (`[compat] responses_stream_indices`, on by default); the bytes of every other API pass
unchanged.
"""

from __future__ import annotations

import time
from typing import Any, cast

import orjson

_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    }
)
# Events about one content part of an item, which the spec indexes with content_index.
_TEXT_PARTS = frozenset(
    {"response.output_text.delta", "response.reasoning_text.delta", "response.refusal.delta"}
)
_PART_EVENTS = frozenset(
    {
        "response.content_part.done",
        "response.output_text.done",
        "response.reasoning_text.done",
        "response.refusal.done",
    }
)


class ResponsesEventIndexer:
    """One stream's state: items seen (id -> output index) and parts per item.

    Any valid SSE is read: events cut anywhere across chunks, CRLF or CR line ends (written
    back as LF), comment lines, `field:value` without the space, several data lines. An event
    that is not a typed Responses event, or whose data does not parse or serialise (orjson
    stops at 255 levels of nesting), passes unchanged: the relay never fails on an event."""

    __slots__ = ("_cr", "_items", "_last_item", "_model", "_parts", "_pending", "_seq")

    def __init__(self, model: str) -> None:
        self._model = model
        self._pending = bytearray()  # an event not yet complete (no blank line yet)
        self._cr = False  # the last chunk ended in CR: an LF that starts the next one is its
        self._seq = 0
        self._items: dict[str, int] = {}
        self._parts: dict[str, int] = {}  # content parts added so far, per item
        self._last_item = -1

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of `chunk` (with what earlier chunks left), completed."""
        if self._cr or b"\r" in chunk:
            chunk = self._lf(chunk)
        if not self._pending and chunk.endswith(b"\n\n"):
            done = chunk  # the usual case: a chunk of whole events, nothing carried over
        else:
            pending = self._pending
            start = max(len(pending) - 1, 0)  # a blank line may straddle two chunks
            pending += chunk
            if pending.find(b"\n\n", start) < 0:
                return b""
            cut = pending.rfind(b"\n\n") + 2
            done = bytes(pending[:cut])
            del pending[:cut]
        if done.find(b"\n\n") == len(done) - 2:  # one event
            return self._event(done)
        return b"".join(self._event(event + b"\n\n") for event in done.split(b"\n\n") if event)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line), as it is."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

    def _lf(self, chunk: bytes) -> bytes:
        """CRLF and CR line ends as LF (SSE allows all three), a CRLF cut between two chunks
        included."""
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._cr = chunk.endswith(b"\r")
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _event(self, event: bytes) -> bytes:
        """One event, its blank line included; unchanged unless it is a typed Responses event
        whose data round-trips."""
        try:
            return self._completed(event)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
            return event  # orjson's errors are ValueError and TypeError subclasses

    def _completed(self, event: bytes) -> bytes:
        name, data_lines, others = _fields(event)
        if not data_lines:
            return event  # a comment, or an event with no data: nothing to index
        parsed = orjson.loads(b"\n".join(data_lines))
        if not isinstance(parsed, dict):
            return event
        if name is None:
            return event  # not a typed Responses event: left alone
        kind, data = name, cast(dict[str, Any], parsed)
        if "sequence_number" not in data:
            data["sequence_number"] = self._seq
        if kind in _DELTAS:
            self._delta(kind, data)
        else:
            self._structural(kind, data)
        line = b"data: " + orjson.dumps(data)
        self._seq += 1  # only now: an event passed unchanged did not take a number
        return b"\n".join([*others, line]) + b"\n\n"

    def _delta(self, name: str, data: dict[str, Any]) -> None:
        item_id = data.get("item_id")
        known = self._items.get(item_id) if isinstance(item_id, str) else None
        data.setdefault("output_index", known if known is not None else max(self._last_item, 0))
        if name in _TEXT_PARTS:
            parts = self._parts.get(item_id, 1) if isinstance(item_id, str) else 1
            data.setdefault("content_index", max(parts - 1, 0))
            if name == "response.output_text.delta":
                data.setdefault("logprobs", [])

    def _structural(self, name: str, data: dict[str, Any]) -> None:
        response = data.get("response")
        if isinstance(response, dict):
            response.setdefault("created_at", int(time.time()))
            response.setdefault("model", self._model)
            response.setdefault("output", [])
        item = data.get("item")
        if name == "response.output_item.added" and isinstance(item, dict):
            data.setdefault("output_index", self._add_item(item.get("id")))
        elif name == "response.output_item.done" and isinstance(item, dict):
            item_key = item.get("id")
            known = self._items.get(item_key) if isinstance(item_key, str) else None
            data.setdefault("output_index", known if known is not None else self._add_item(None))
        item_id = data.get("item_id")
        if not isinstance(item_id, str):
            return
        data.setdefault("output_index", self._items.get(item_id, max(self._last_item, 0)))
        parts = self._parts.get(item_id, 0)
        if name == "response.content_part.added":
            data.setdefault("content_index", parts)
            self._parts[item_id] = parts + 1
        elif name in _PART_EVENTS:
            data.setdefault("content_index", max(parts - 1, 0))
            if name == "response.output_text.done":
                data.setdefault("logprobs", [])

    def _add_item(self, item_id: object) -> int:
        index = len(self._items)
        key = item_id if isinstance(item_id, str) else f"#{index}"
        self._items[key] = index
        self._last_item = index
        return index


def _fields(event: bytes) -> tuple[str | None, list[bytes], list[bytes]]:
    """An event's name, its data lines' values and its other lines (comments, id, retry, and
    the event line), in order. Raises UnicodeDecodeError on a name that is not UTF-8."""
    name: str | None = None
    data: list[bytes] = []
    others: list[bytes] = []
    for line in event.split(b"\n"):
        if not line:
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
            continue
        if field == b"event":
            name = value.decode()
        others.append(line)
    return name, data, others

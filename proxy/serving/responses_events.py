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
from typing import Any

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
_DATA = b"data: {"


class ResponsesEventIndexer:
    """One stream's state: items seen (id -> output index) and parts per item."""

    __slots__ = ("_items", "_last_item", "_model", "_parts", "_pending", "_seq")

    def __init__(self, model: str) -> None:
        self._model = model
        self._pending = bytearray()  # an event not yet complete (no blank line yet)
        self._seq = 0
        self._items: dict[str, int] = {}
        self._parts: dict[str, int] = {}  # content parts added so far, per item
        self._last_item = -1

    def feed(self, chunk: bytes) -> bytes:
        """The complete events of `chunk` (with what earlier chunks left), completed."""
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

    def _event(self, event: bytes) -> bytes:
        """One event, its blank line included."""
        at = event.find(_DATA)
        if at < 0 or not event.startswith(b"event: "):
            return event  # not a typed Responses event: left alone
        try:
            data = orjson.loads(event[at + 6 : -2])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(data, dict):
            return event
        name = event[7 : event.find(b"\n")].decode()
        if "sequence_number" not in data:
            data["sequence_number"] = self._seq
        self._seq += 1
        if name in _DELTAS:
            self._delta(name, data)
        else:
            self._structural(name, data)
        return b"".join((event[: at + 6], orjson.dumps(data), b"\n\n"))

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

"""Completing llama-server's `/v1/responses` stream events with the fields the spec requires.

llama-server's Responses stream lacks `sequence_number` on every event, `output_index` and
`content_index` on the item and part events, and `created_at`/`model`/`output` on the response
of `response.created`. The openai SDK's `responses.stream()` helper indexes its snapshot with
them (it raises without), and the AI SDK's `@ai-sdk/openai` provider (opencode) validates them.

Cost: token deltas (nearly every event) take a fixed-size byte splice after `data: {`, never a
JSON parse; the few structural events (item and part added/done, created, completed) are parsed.
Only the Responses API is touched (`[compat] responses_stream_indices`, on by default); the bytes
of every other API pass unchanged.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

_DELTAS = frozenset(
    {
        b"response.output_text.delta",
        b"response.reasoning_text.delta",
        b"response.reasoning_summary_text.delta",
        b"response.function_call_arguments.delta",
        b"response.refusal.delta",
    }
)
_TEXT_PARTS = frozenset(
    {
        b"response.output_text.delta",
        b"response.reasoning_text.delta",
        b"response.refusal.delta",
    }
)
_ITEM_ID = b'"item_id":"'
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
        pending = self._pending
        start = max(len(pending) - 1, 0)  # a blank line may straddle two chunks
        pending += chunk
        cut = pending.find(b"\n\n", start)
        if cut < 0:
            return b""
        cut = pending.rfind(b"\n\n") + 2
        done = bytes(pending[:cut])
        del pending[:cut]
        return b"".join(self._event(event) for event in done.split(b"\n\n") if event)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without its blank line), as it is."""
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

    def _event(self, event: bytes) -> bytes:
        at = event.find(_DATA)
        if at < 0 or not event.startswith(b"event: "):
            return event + b"\n\n"  # not a typed Responses event: left alone
        name = event[7 : event.index(b"\n")] if b"\n" in event else b""
        seq = self._seq
        self._seq += 1
        if name in _DELTAS:
            return self._delta(event, at, name, seq)
        return self._structural(event[: at + 6], event[at + 6 :], name.decode(), seq)

    def _delta(self, event: bytes, at: int, name: bytes, seq: int) -> bytes:
        item_id = _item_id(event)
        output_index = self._items.get(item_id, self._last_item) if item_id else self._last_item
        fields = f'"sequence_number":{seq},"output_index":{max(output_index, 0)},'
        if name in _TEXT_PARTS:
            part = max(self._parts.get(item_id or "", 1) - 1, 0)
            fields += f'"content_index":{part},'
            if name == b"response.output_text.delta" and b'"logprobs"' not in event:
                fields += '"logprobs":[],'
        cut = at + len(_DATA)
        return b"".join((event[:cut], fields.encode(), event[cut:], b"\n\n"))

    def _structural(self, head: bytes, payload: bytes, name: str, seq: int) -> bytes:
        try:
            data = orjson.loads(payload)
        except ValueError:
            return head + payload + b"\n\n"
        if not isinstance(data, dict):
            return head + payload + b"\n\n"
        self._complete(name, data)
        data.setdefault("sequence_number", seq)
        return head + orjson.dumps(data) + b"\n\n"

    def _complete(self, name: str, data: dict[str, Any]) -> None:
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
        if isinstance(item_id, str):
            data.setdefault("output_index", self._items.get(item_id, max(self._last_item, 0)))
            if name == "response.content_part.added":
                data.setdefault("content_index", self._parts.get(item_id, 0))
                self._parts[item_id] = self._parts.get(item_id, 0) + 1
            elif "content_index" not in data and name.startswith("response.") and "part" in name:
                data["content_index"] = max(self._parts.get(item_id, 1) - 1, 0)
            elif name == "response.output_text.done":
                data.setdefault("content_index", max(self._parts.get(item_id, 1) - 1, 0))
                data.setdefault("logprobs", [])

    def _add_item(self, item_id: object) -> int:
        index = len(self._items)
        key = item_id if isinstance(item_id, str) else f"#{index}"
        self._items[key] = index
        self._last_item = index
        return index


def _item_id(event: bytes) -> str | None:
    at = event.find(_ITEM_ID)
    if at < 0:
        return None
    start = at + len(_ITEM_ID)
    end = event.find(b'"', start)
    return event[start:end].decode() if end > start else None

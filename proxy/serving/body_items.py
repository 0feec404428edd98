"""A request body bounded by its items, not only by its bytes, before it is parsed.

32 MiB of `{"messages": [{}, {}, ...]}` is 11 million empty objects: parsed (orjson), walked for
the routing features and mended on the event loop, it kept /health from answering for 10 s and
grew the process by ~1 GB (31x the body). So each body is held to the ``[server]`` caps: messages,
Responses input items, content parts per message (or input item), tools, and items in all (every
object, array and value between commas), and one over a cap is refused (413, naming the cap and
its setting) before anything walks it:

- a body under ``SCAN_BYTES`` is parsed at once, on the loop (it cannot hold a million items),
  and its arrays' lengths checked;
- a larger one is first counted from its bytes by ``count_items``, which allocates nothing per
  item and stops at the first cap passed, then parsed, both in a worker thread, one body at a
  time (``parsing``). orjson holds the GIL while it parses: the count comes first so that what
  it is given is bounded; the count itself is a loop of short C calls (regex searches, finds;
  a run of simple items is one search), and it offers the GIL to the event loop every few
  hundred microseconds (``time.sleep(0)``): a thread that only waits for the switch interval
  kept /health waiting 5 ms at each of its turns (bench/abuse_items.py).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.config.settings import ServerSettings

SCAN_BYTES = 1 << 20
"""Bodies from this size on are counted before they are parsed, off the event loop (a smaller
one holds at most ~700k items: one per 1.5 bytes)."""
_STRUCTURE = re.compile(rb'["\[\]{},:]')
_SIMPLE = rb'(?:\{\s*\}|\[\s*\]|-?[0-9][0-9.eE+-]*|true|false|null|"[^"\\,]*")'
_RUN = re.compile(rb"\s*" + _SIMPLE + rb"(?:\s*,\s*" + _SIMPLE + rb")*")
"""A run of simple array items (empty objects and arrays, numbers, literals, strings without a
comma or an escape): stepped over in one search, its commas counted in C."""
_RUN_SPAN = 1 << 16  # bytes one run's search reads at most: the event loop's turn comes soon
_TURNS_PER_YIELD = 512  # structural characters read between two offers of the GIL (~0.3 ms)
_CAPPED = {b"messages": "messages", b"input": "input_items", b"tools": "tools"}
_PARTS_OF = ("messages", "input_items")  # whose items' "content" arrays are capped


class TooManyItems(Exception):
    """The body is over one of the caps; the message names it and its setting (a 413)."""


@dataclass(frozen=True)
class ItemLimits:
    """The caps of one body (the [server] settings)."""

    messages: int
    input_items: int
    content_parts: int
    tools: int
    items: int

    @classmethod
    def of(cls, server: ServerSettings) -> ItemLimits:
        return cls(
            server.max_messages,
            server.max_input_items,
            server.max_content_parts,
            server.max_tools,
            server.max_body_items,
        )

    def problem(self, cap: str, where: str = "the request") -> TooManyItems:
        words = {
            "messages": "messages",
            "input_items": "input items",
            "content_parts": "content parts",
            "tools": "tools",
            "items": "JSON items",
        }[cap]
        setting = "max_body_items" if cap == "items" else f"max_{cap}"
        limit = getattr(self, cap)
        return TooManyItems(
            f"{where} has more than {limit} {words}, the most this proxy accepts (server.{setting})"
        )


async def parse_bounded(raw: bytes, limits: ItemLimits, parsing: asyncio.Semaphore) -> Any:
    """``orjson.loads(raw)``, held to ``limits`` first: TooManyItems past a cap, else what
    orjson returns or raises. A body of SCAN_BYTES or more is counted and parsed in a worker
    thread, ``parsing`` bounding how many at once."""
    if len(raw) < SCAN_BYTES:
        return _parse_small(raw, limits)
    async with parsing:
        return await asyncio.to_thread(_parse_large, raw, limits)


def _parse_small(raw: bytes, limits: ItemLimits) -> Any:
    body = orjson.loads(raw)
    if isinstance(body, dict):
        check_parsed(body, limits)
    return body


def _parse_large(raw: bytes, limits: ItemLimits) -> Any:
    count_items(raw, limits)
    return orjson.loads(raw)


def check_parsed(body: dict[str, Any], limits: ItemLimits) -> None:
    """The caps, on a parsed body's arrays (a small one: its items are few)."""
    for key, cap in _CAPPED.items():
        items = body.get(key.decode())
        if not isinstance(items, list):
            continue
        if len(items) > getattr(limits, cap):
            raise limits.problem(cap)
        if cap in _PARTS_OF:
            for i, item in enumerate(items):
                parts = item.get("content") if isinstance(item, dict) else None
                if isinstance(parts, list) and len(parts) > limits.content_parts:
                    raise limits.problem("content_parts", f"{key.decode()}[{i}]")


def count_items(raw: bytes, limits: ItemLimits) -> None:
    """Count the capped arrays' items and every item of ``raw`` from its bytes, without
    parsing it; TooManyItems at the first cap passed. Bytes that are not JSON are left to the
    parser that follows (nothing raised here)."""
    counter = _Counter(raw, limits)
    try:
        counter.run()
    except IndexError:  # a closing bracket with nothing open: not JSON, orjson says so
        return


class _Counter:
    """One pass over a body's structure: strings stepped over whole, each array in a frame.
    A frame is [the cap its items count against (or None), items so far, the key being read
    (objects)]; an array's items are its commas plus one."""

    def __init__(self, raw: bytes, limits: ItemLimits) -> None:
        self.raw, self.limits = raw, limits
        self.stack: list[list[Any]] = []
        self.items = 0
        self.string: tuple[int, int] = (0, 0)  # the last string's span, quotes included

    def run(self) -> None:
        raw, search, stack = self.raw, _STRUCTURE.search, self.stack
        match, turns = search(raw), 0
        while match is not None:
            char, at = raw[match.start()], match.end()
            turns += 1
            if turns % _TURNS_PER_YIELD == 0:
                time.sleep(0)  # the GIL to the event loop, if it waits for it
            if char == 0x22:  # '"'
                at = self.string_end(at)
            elif char in b"{[":
                self.open(char)
                at = self.run_of_items(at) if char == 0x5B else at
            elif char in b"]}":
                stack.pop()
            elif char == 0x2C:  # ','
                self.comma()
                at = self.run_of_items(at) if stack[-1][0] != "{" else at
            elif stack and stack[-1][0] == "{":  # ':' after a key
                stack[-1][2] = raw[self.string[0] + 1 : self.string[1] - 1]
            match = search(raw, at)

    def run_of_items(self, at: int) -> int:
        """Step over the run of simple items that starts at ``at`` in the array being read,
        counting them: 11 million empty objects are a few hundred searches, not 33 million
        turns of the loop. Where the run ends (at its last item's end)."""
        raw, frame = self.raw, self.stack[-1]
        while True:
            run = _RUN.match(raw, at, min(at + _RUN_SPAN, len(raw)))
            if run is None or run.end() == at:
                return at
            commas = raw.count(b",", at, run.end())
            if commas:
                self.items += commas
                frame[1] += commas
                self.check(frame)
                if self.items > self.limits.items:
                    raise self.limits.problem("items")
            at = run.end()
            time.sleep(0)  # the GIL to the event loop, if it waits: a span is ~0.1 ms of work
            follows = _STRUCTURE.search(raw, at)
            if follows is None or raw[follows.start()] != 0x2C:
                return at
            self.items += 1  # the comma after the run, and the run that may follow it
            frame[1] += 1
            self.check(frame)
            at = follows.end()

    def string_end(self, at: int) -> int:
        """Where the string opened before ``at`` ends (after its quote); it is remembered
        (a key, when a ':' follows)."""
        raw, start = self.raw, at - 1
        while True:
            end = raw.find(b'"', at)
            if end < 0:
                self.string = (start, len(raw))
                return len(raw)
            escapes = end
            while raw[escapes - 1] == 0x5C:  # '\\'
                escapes -= 1
            at = end + 1
            if (end - escapes) % 2 == 0:  # not escaped itself
                self.string = (start, at)
                return at

    def open(self, char: int) -> None:
        self.count_one()
        if char == 0x7B:  # '{'
            self.stack.append(["{", None, None])
            return
        self.stack.append([self.cap_of_new_array(), 1, None])
        self.check(self.stack[-1])

    def cap_of_new_array(self) -> str | None:
        """The cap an array opened here counts against: top-level messages, input or tools,
        or the content of one of their items."""
        stack = self.stack
        if len(stack) == 1 and stack[0][0] == "{":
            return _CAPPED.get(stack[0][2])
        if len(stack) == 3 and stack[1][0] in _PARTS_OF and stack[2][2] == b"content":
            return "content_parts"
        return None

    def comma(self) -> None:
        self.count_one()
        frame = self.stack[-1]
        if frame[0] == "{":
            frame[2] = None
        else:
            frame[1] += 1
            self.check(frame)

    def count_one(self) -> None:
        self.items += 1
        if self.items > self.limits.items:
            raise self.limits.problem("items")

    def check(self, frame: list[Any]) -> None:
        cap = frame[0]
        if cap is None or frame[1] <= getattr(self.limits, cap):
            return
        where = "the request"
        if cap == "content_parts":  # whose: the item of messages or input being read
            owner = self.stack[1]
            where = f"{'messages' if owner[0] == 'messages' else 'input'}[{owner[1] - 1}]"
        raise self.limits.problem(cap, where)

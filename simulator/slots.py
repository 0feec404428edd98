"""Server slots (-np) with a per-slot prefix cache, and FIFO waiting for a free slot.

As llama-server does: an idle slot whose cached tokens share the longest prefix with the new
prompt is taken (if that prefix is at least 10 % of the prompt), else the least recently used
idle slot, so other sessions' caches survive. A request that finds no idle slot waits its turn.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

_SIMILARITY = 0.1  # llama-server --slot-prompt-similarity default


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists.

    Compares growing blocks (C-speed slice equality), so the cost follows the common part, not the
    prompt length: with hundreds of slots, most share only the chat template's first tokens.
    """
    n = min(len(a), len(b))
    i, step = 0, 64
    while i < n and a[i : i + step] == b[i : i + step]:
        i += step
        step = min(step * 2, 8192)
    if i >= n:
        return n
    end = min(i + step, n)
    while i < end and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    id: int
    cache: list[int] = field(default_factory=list)
    busy: bool = False
    decoding: bool = False
    task_id: int = -1
    n_prompt: int = 0
    n_decoded: int = 0
    last_used: int = 0
    depth: int = 0  # draft depth of the request decoding here
    overhead: float = 0.0  # its expected speculative share of a step (model.speculative_overhead)


@dataclass
class _Waiter:
    tokens: list[int]
    future: asyncio.Future[Slot]


class SlotPool:
    def __init__(self, n_slots: int) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self._waiters: deque[_Waiter] = deque()
        self._clock = itertools.count(1)
        self.n_decoding = 0
        # Running totals over the decoding slots, kept as they change: a step reads them in O(1)
        # however many slots there are.
        self.overhead_sum = 0.0
        self._depths: Counter[int] = Counter()

    @property
    def n_depths(self) -> int:
        """Distinct draft depths among the decoding slots."""
        return len(self._depths)

    def has_depth(self, depth: int) -> bool:
        return depth in self._depths

    def start_decoding(self, slot: Slot, depth: int, overhead: float) -> None:
        slot.decoding, slot.depth, slot.overhead = True, depth, overhead
        self.n_decoding += 1
        self._depths[depth] += 1
        self.overhead_sum += overhead

    def set_overhead(self, slot: Slot, overhead: float) -> None:
        self.overhead_sum += overhead - slot.overhead
        slot.overhead = overhead

    def _stop_decoding(self, slot: Slot) -> None:
        slot.decoding = False
        self.n_decoding -= 1
        self._depths[slot.depth] -= 1
        if not self._depths[slot.depth]:
            del self._depths[slot.depth]
        self.overhead_sum = self.overhead_sum - slot.overhead if self.n_decoding else 0.0

    @property
    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    @property
    def n_waiting(self) -> int:
        return len(self._waiters)

    def best_prefix(self, tokens: list[int]) -> int:
        """Longest cached prefix over all slots (what /sim/predict assumes will be reused)."""
        return max((common_prefix(s.cache, tokens) for s in self.slots), default=0)

    def _pick(self, tokens: list[int]) -> Slot:
        idle = [s for s in self.slots if not s.busy]
        scored = [(common_prefix(s.cache, tokens), s) for s in idle]
        lcp, best = max(scored, key=lambda p: (p[0], -p[1].last_used))
        if tokens and lcp / len(tokens) >= _SIMILARITY:
            return best
        return min(idle, key=lambda s: s.last_used)

    def _claim(self, slot: Slot) -> Slot:
        slot.busy = True
        slot.last_used = next(self._clock)
        return slot

    async def acquire(self, tokens: list[int]) -> Slot:
        if not self._waiters and any(not s.busy for s in self.slots):
            return self._claim(self._pick(tokens))
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(tokens, future)
        self._waiters.append(waiter)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result(), None)  # handed a slot as we were cancelled
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self, slot: Slot, cache: list[int] | None) -> None:
        """Free the slot (keeping `cache` as its prompt cache) and hand it to the next waiter."""
        if cache is not None:
            slot.cache = cache
        if slot.decoding:
            self._stop_decoding(slot)
        slot.busy = False
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(self._claim(self._pick(waiter.tokens)))
                return

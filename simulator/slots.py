"""Server slots (-np) with a per-slot prefix cache, and FIFO waiting for a free slot.

As llama-server does: an idle slot whose cached tokens share the longest prefix with the new
prompt is taken (if that prefix is at least 10 % of the prompt), else the least recently used
idle slot, so other sessions' caches survive. A request that finds no idle slot waits its turn.

And as llama-server's host-memory prompt cache does (``--cache-ram``, on by default since PR
16391; ``server_prompt_cache`` in tools/server/server-task.cpp): before a slot taken by LRU, or
by similarity while keeping under half its cache, starts a new prompt, its state is saved to host
memory, and the saved state that best matches the new prompt is loaded into the slot instead; so
an agent whose slot a short chat took gets its context back when its next turn comes, at the
cost of a copy rather than a new prefill. The cache holds states oldest first and drops the
oldest past its size; with ``--cache-idle-slots`` (default) every idle slot is saved at each new
task.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

_SIMILARITY = 0.1  # llama-server --slot-prompt-similarity default
_KEEP_SAVED = 0.5  # a slot chosen by similarity that keeps less of its cache than this is saved
_MIN_KEEP_LOADED = 0.25  # a saved state is loaded only if this much of it is reused


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
    restored: int = 0  # tokens of the state loaded from the host cache for its current task
    saved: bool = False  # its cache is in the host cache as it is now (nothing new to save)
    depth: int = 0  # draft depth of the request decoding here
    overhead: float = 0.0  # its expected speculative share of a step (model.speculative_overhead)


class HostCache:
    """Saved slot states by their tokens, oldest first, within ``limit_bytes`` (< 0: no
    limit); a state of n tokens weighs ``state_bytes + n * bytes_per_token``."""

    def __init__(self, limit_bytes: float, bytes_per_token: float, state_bytes: float) -> None:
        self.limit = limit_bytes
        self.per_token = bytes_per_token
        self.fixed = state_bytes
        self.states: deque[list[int]] = deque()
        self.size = 0.0  # what the states weigh together

    def weight(self, tokens: list[int]) -> float:
        return self.fixed + self.per_token * len(tokens)

    def best_prefix(self, tokens: list[int]) -> int:
        """Longest prefix of ``tokens`` a saved state holds."""
        return max((common_prefix(t, tokens) for t in self.states), default=0)

    def save(self, tokens: list[int]) -> None:
        n = len(tokens)
        if n == 0 or any(common_prefix(t, tokens) == n for t in self.states):
            return  # nothing to save, or already saved whole
        new = self.weight(tokens)
        if 0 <= self.limit < new:
            return
        # a saved prefix of this state is obsolete
        self.states = deque(t for t in self.states if common_prefix(t, tokens) < len(t))
        self.size = sum(self.weight(t) for t in self.states)
        while self.states and self.limit >= 0 and self.size + new > self.limit:
            self.size -= self.weight(self.states.popleft())
        self.states.append(list(tokens))
        self.size += new

    def load(self, current: list[int], tokens: list[int]) -> list[int] | None:
        """The saved state to load for ``tokens`` instead of the slot's ``current`` one (taken
        out of the cache), or None: the one that reuses more of both the prompt and itself."""
        lcp = common_prefix(current, tokens)
        keep_best = lcp / len(current) if current else -1.0
        sim_best = lcp / len(tokens) if tokens else 0.0
        best: int | None = None
        for i, saved in enumerate(self.states):
            common = common_prefix(saved, tokens)
            keep, sim = common / len(saved), common / max(len(tokens), 1)
            if keep >= _MIN_KEEP_LOADED and keep > keep_best and sim > sim_best:
                keep_best, sim_best, best = keep, sim, i
        if best is None:
            return None
        state = self.states[best]
        del self.states[best]
        self.size -= self.weight(state)
        return state


@dataclass
class _Waiter:
    tokens: list[int]
    future: asyncio.Future[Slot]


class SlotPool:
    def __init__(
        self, n_slots: int, host: HostCache | None = None, *, save_idle: bool = False
    ) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self.host = host
        self.save_idle = save_idle and host is not None
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
        """Longest cached prefix over all slots and the host cache (what /sim/predict assumes
        will be reused: a saved state is loaded back for the prompt it matches)."""
        slots = max((common_prefix(s.cache, tokens) for s in self.slots), default=0)
        return max(slots, self.host.best_prefix(tokens)) if self.host is not None else slots

    def _pick(self, tokens: list[int]) -> tuple[Slot, bool]:
        """The slot for a prompt, and whether its state goes through the host cache."""
        idle = [s for s in self.slots if not s.busy]
        scored = [(common_prefix(s.cache, tokens), s) for s in idle]
        lcp, best = max(scored, key=lambda p: (p[0], -p[1].last_used))
        if tokens and lcp / len(tokens) >= _SIMILARITY:
            return best, lcp < _KEEP_SAVED * len(best.cache)
        return min(idle, key=lambda s: s.last_used), True

    def _take(self, tokens: list[int]) -> Slot:
        slot, through_host = self._pick(tokens)
        slot.busy = True
        slot.last_used = next(self._clock)
        slot.restored = 0
        host = self.host
        if host is not None and through_host:
            self._save(slot, host)
            loaded = host.load(slot.cache, tokens)
            if loaded is not None:
                slot.cache, slot.restored, slot.saved = loaded, len(loaded), False
        if self.save_idle and host is not None:
            for other in self.slots:
                if not other.busy:
                    self._save(other, host)
        return slot

    @staticmethod
    def _save(slot: Slot, host: HostCache) -> None:
        if not slot.saved:
            host.save(slot.cache)
            slot.saved = True

    async def acquire(self, tokens: list[int]) -> Slot:
        if not self._waiters and any(not s.busy for s in self.slots):
            return self._take(tokens)
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
            slot.cache, slot.saved = cache, False
        if slot.decoding:
            self._stop_decoding(slot)
        slot.busy = False
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(self._take(waiter.tokens))
                return

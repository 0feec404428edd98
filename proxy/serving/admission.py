"""Backpressure: a bounded FIFO queue per model in front of the backends' slots.

A backend takes at most as many requests as it has slots (llama-server queues the rest inside,
where the proxy can neither see nor reorder them). When every ready backend of a model is full,
requests wait here in arrival order; past `max_queue` waiters, or after `timeout_s` of waiting,
they are refused with 429 so clients back off instead of piling up.

Fairness: capacity freed by a finished request is handed to the oldest waiter, never to a request
that arrives in the meantime, so a later request cannot overtake an earlier one.

A request pinned to a profile (X-MTP-Profile) waits the same way, in a lane of its own per
(model, profile) with the same limits: it needs a slot of that profile, and must not hold up the
model's other requests while it waits for one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_LANE = "\x00"  # model + _LANE + profile: a pinned lane's key (no model name holds a NUL)


class QueueRefused(Exception):
    """The request cannot be admitted; `retry_after_s` tells the client when to try again."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _ModelQueue:
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    handoffs: int = 0  # capacity promised to woken waiters that have not run yet


class Admission:
    def __init__(self, max_queue: int, timeout_s: float) -> None:
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._queues: dict[str, _ModelQueue] = {}

    def queued(self, model: str) -> int:
        return sum(len(queue.waiters) for queue in self._lanes(model))

    async def admit(
        self, model: str, has_capacity: Callable[[], bool], lane: str | None = None
    ) -> None:
        """Return when the request may be routed; raise QueueRefused when it may not.

        `lane`: the profile a request is pinned to (its own queue), None for the model's."""
        key = model if lane is None else f"{model}{_LANE}{lane}"
        queue = self._queues.setdefault(key, _ModelQueue())
        if not queue.waiters and not queue.handoffs and has_capacity():
            return
        if len(queue.waiters) >= self.max_queue:
            raise QueueRefused(f"{model}: {self.max_queue} requests already waiting", 1.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        waiter: asyncio.Future[None] = loop.create_future()
        queue.waiters.append(waiter)
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                self._abandon(queue, waiter)
                raise QueueRefused(
                    f"{model}: no capacity within {self.timeout_s:g} s", self.timeout_s
                ) from None
            except asyncio.CancelledError:
                self._abandon(queue, waiter)
                raise
            queue.handoffs -= 1
            if has_capacity():
                return
            # Someone else's request took the slot first (e.g. a retry): back to the front.
            waiter = loop.create_future()
            queue.waiters.appendleft(waiter)

    def notify(self, model: str, free_slots: int) -> None:
        """`free_slots` slots of `model` are free now: wake that many waiters, oldest first, in
        each lane (a woken pinned waiter whose profile is still full goes back to the front)."""
        for queue in self._lanes(model):
            for _ in range(free_slots - queue.handoffs):
                if not self._pass_on(queue):
                    break

    def _lanes(self, model: str) -> list[_ModelQueue]:
        prefix = model + _LANE
        return [q for key, q in self._queues.items() if key == model or key.startswith(prefix)]

    def _abandon(self, queue: _ModelQueue, waiter: asyncio.Future[None]) -> None:
        if waiter in queue.waiters:
            queue.waiters.remove(waiter)
        elif waiter.done() and not waiter.cancelled():
            # Woken but leaving anyway: pass the promised capacity on to the next in line.
            queue.handoffs -= 1
            self._pass_on(queue)

    def _pass_on(self, queue: _ModelQueue) -> bool:
        while queue.waiters:
            waiter = queue.waiters.popleft()
            if not waiter.done():
                queue.handoffs += 1
                waiter.set_result(None)
                return True
        return False

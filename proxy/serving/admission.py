"""Backpressure: a bounded FIFO queue per model in front of the backends' slots.

A backend takes at most as many requests as it has slots (llama-server queues the rest inside,
where the proxy can neither see nor reorder them). When every ready backend of a model is full,
requests wait here in arrival order; past `max_queue` waiters, or after `timeout_s` of waiting,
they are refused with 429 so clients back off instead of piling up.

Fairness: capacity freed by a finished request is handed to the oldest waiter that can use it,
never to a request that arrives in the meantime, so a later request cannot overtake an earlier one.
A waiter that cannot use the capacity at hand (it waits for a process that failed it to come back,
or for its session's full cache holder) keeps its place without holding up those that can: each
waiter carries its own test of capacity, and the queue asks it before waking it.

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
class _Waiter:
    woken: asyncio.Future[None]
    has_capacity: Callable[[], bool]


@dataclass
class _ModelQueue:
    waiters: deque[_Waiter] = field(default_factory=deque)
    handoffs: int = 0  # capacity promised to woken waiters that have not run yet

    def any_could_run(self) -> bool:
        """Whether a waiter could take the capacity at hand: a release has not woken it yet."""
        return any(w.has_capacity() for w in self.waiters if not w.woken.done())


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
        if not queue.handoffs and has_capacity() and not queue.any_could_run():
            return
        if len(queue.waiters) >= self.max_queue:
            raise QueueRefused(f"{model}: {self.max_queue} requests already waiting", 1.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        waiter = _Waiter(loop.create_future(), has_capacity)
        queue.waiters.append(waiter)
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter.woken
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
            waiter = _Waiter(loop.create_future(), has_capacity)
            queue.waiters.appendleft(waiter)

    def notify(self, model: str, free_slots: int) -> None:
        """`free_slots` slots of `model` are free now: wake up to that many waiters that can use
        them, oldest first, in each lane (a woken waiter whose slot was taken meanwhile goes
        back to the front)."""
        for queue in self._lanes(model):
            self._pass_on(queue, free_slots - queue.handoffs)

    def _lanes(self, model: str) -> list[_ModelQueue]:
        prefix = model + _LANE
        return [q for key, q in self._queues.items() if key == model or key.startswith(prefix)]

    def _abandon(self, queue: _ModelQueue, waiter: _Waiter) -> None:
        if waiter in queue.waiters:
            queue.waiters.remove(waiter)
        elif waiter.woken.done() and not waiter.woken.cancelled():
            # Woken but leaving anyway: pass the promised capacity on to the next in line.
            queue.handoffs -= 1
            self._pass_on(queue, 1)

    @staticmethod
    def _pass_on(queue: _ModelQueue, count: int) -> None:
        """Wake up to `count` waiters that can use the capacity at hand, oldest first."""
        for waiter in list(queue.waiters):
            if count <= 0:
                return
            if waiter.woken.done():  # cancelled: its task is leaving
                queue.waiters.remove(waiter)
            elif waiter.has_capacity():
                queue.waiters.remove(waiter)
                queue.handoffs += 1
                waiter.woken.set_result(None)
                count -= 1

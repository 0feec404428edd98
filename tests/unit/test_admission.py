"""The admission queue: FIFO hand-off of freed capacity, bounded length, timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from proxy.serving.admission import Admission, QueueRefused


class Slots:
    """A model's capacity as the pool would report it."""

    def __init__(self, free: int) -> None:
        self.free = free

    def has_room(self) -> bool:
        return self.free > 0


async def enter(admission: Admission, slots: Slots, order: list[int], n: int) -> None:
    await admission.admit("m", slots.has_room)
    slots.free -= 1  # the request now occupies a slot
    order.append(n)


async def until(condition: Callable[[], bool], steps: int = 1000) -> None:
    """Let the other tasks run until `condition` holds (each step one pass of the loop): the
    order of events, not a guess at how long they take."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_free_capacity_admits_at_once() -> None:
    admission = Admission(max_queue=4, timeout_s=1.0)
    slots = Slots(1)
    await asyncio.wait_for(admission.admit("m", slots.has_room), 0.1)
    assert admission.queued("m") == 0


async def test_waiters_are_served_in_arrival_order_and_never_overtaken() -> None:
    admission = Admission(max_queue=10, timeout_s=5.0)
    slots = Slots(0)
    order: list[int] = []
    waiting = []
    for n in range(5):
        waiting.append(asyncio.create_task(enter(admission, slots, order, n)))
        await until(lambda n=n: admission.queued("m") == n + 1)  # in line before the next
    for expected in range(5):
        slots.free += 1
        admission.notify("m", slots.free)
        if expected == 2:
            # A newcomer arriving while capacity is promised to a waiter must queue behind.
            waiting.append(asyncio.create_task(enter(admission, slots, order, 99)))
        await until(lambda expected=expected: len(order) == expected + 1)
    slots.free += 1
    admission.notify("m", slots.free)
    await asyncio.wait_for(asyncio.gather(*waiting), 1.0)
    assert order == [0, 1, 2, 3, 4, 99]


async def test_a_full_queue_refuses_at_once() -> None:
    admission = Admission(max_queue=2, timeout_s=5.0)
    slots = Slots(0)
    waiting = [asyncio.create_task(admission.admit("m", slots.has_room)) for _ in range(2)]
    await until(lambda: admission.queued("m") == 2)
    with pytest.raises(QueueRefused) as refused:
        await asyncio.wait_for(admission.admit("m", slots.has_room), 0.1)
    assert refused.value.retry_after_s >= 1
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert admission.queued("m") == 0


async def test_waiting_too_long_is_refused_and_leaves_the_queue() -> None:
    admission = Admission(max_queue=4, timeout_s=0.05)
    slots = Slots(0)
    with pytest.raises(QueueRefused, match="no capacity within"):
        await admission.admit("m", slots.has_room)
    assert admission.queued("m") == 0


async def test_a_woken_waiter_that_leaves_passes_capacity_on() -> None:
    admission = Admission(max_queue=4, timeout_s=5.0)
    slots = Slots(0)
    order: list[int] = []
    first = asyncio.create_task(enter(admission, slots, order, 1))
    second = asyncio.create_task(enter(admission, slots, order, 2))
    await until(lambda: admission.queued("m") == 2)
    slots.free = 1
    admission.notify("m", 1)
    first.cancel()  # the client of the first waiter went away before it ran
    await asyncio.wait_for(second, 1.0)
    assert order == [2]


async def test_a_newcomer_does_not_take_capacity_promised_to_a_woken_waiter() -> None:
    admission = Admission(max_queue=4, timeout_s=5.0)
    slots = Slots(0)
    order: list[int] = []
    waiter = asyncio.create_task(enter(admission, slots, order, 1))
    await until(lambda: admission.queued("m") == 1)
    # The newcomer's first step is scheduled before the waiter is woken, so it runs first:
    # it arrives while the freed slot is promised to the waiter but not yet taken.
    newcomer = asyncio.create_task(enter(admission, slots, order, 2))
    slots.free = 1
    admission.notify("m", 1)
    await until(lambda: len(order) == 1)
    assert order == [1]  # the waiter got its slot; the newcomer queued behind it
    slots.free += 1
    admission.notify("m", slots.free)
    await asyncio.wait_for(asyncio.gather(waiter, newcomer), 1.0)
    assert order == [1, 2]


def never() -> bool:
    """A waiter whose slot cannot come from the capacity at hand, e.g. a request waiting for a
    process that failed it to come back (a new generation), or one pinned to a full profile."""
    return False


async def test_a_waiter_that_cannot_use_a_free_slot_does_not_hold_up_a_newcomer_that_can() -> None:
    admission = Admission(max_queue=4, timeout_s=5.0)
    stuck = asyncio.create_task(admission.admit("m", never))
    await until(lambda: admission.queued("m") == 1)
    slots = Slots(1)
    # No request is in flight, so no release will ever wake the newcomer: it must not queue.
    await asyncio.wait_for(admission.admit("m", slots.has_room), 1.0)
    assert admission.queued("m") == 1  # the other still waits for its own kind of slot
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)


async def test_a_freed_slot_goes_to_the_oldest_waiter_that_can_use_it() -> None:
    admission = Admission(max_queue=4, timeout_s=5.0)
    slots = Slots(0)
    order: list[int] = []
    stuck = asyncio.create_task(admission.admit("m", never))
    await until(lambda: admission.queued("m") == 1)
    waiter = asyncio.create_task(enter(admission, slots, order, 1))
    await until(lambda: admission.queued("m") == 2)
    slots.free = 1
    admission.notify("m", 1)
    await asyncio.wait_for(waiter, 1.0)
    assert order == [1] and admission.queued("m") == 1
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)

"""Deferred bookkeeping: runs a moment later, in order, all of it, and at once when flushed."""

from __future__ import annotations

import asyncio

from proxy.observability.bookkeeping import Bookkeeping


async def turns(n: int) -> None:
    """Let the event loop run `n` times (what arrived meanwhile gets its turn)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_work_runs_after_the_delay_not_before() -> None:
    loop = asyncio.get_running_loop()
    bookkeeping = Bookkeeping(delay_s=3600.0)
    done: list[int] = []
    bookkeeping.defer(lambda: done.append(1))
    bookkeeping.defer(lambda: done.append(2))
    await turns(20)
    assert done == []  # the loop is free for whatever arrives meanwhile
    soon = Bookkeeping(delay_s=0.05)
    ran = asyncio.Event()
    deferred_at = loop.time()
    soon.defer(lambda: done.append(3))
    soon.defer(ran.set)
    await asyncio.wait_for(ran.wait(), 10)
    assert done == [3] and loop.time() - deferred_at >= 0.05  # in order, never early


async def test_flush_runs_everything_now_and_cancels_the_timer() -> None:
    bookkeeping = Bookkeeping(delay_s=0.05)
    done: list[int] = []
    bookkeeping.defer(lambda: done.append(1))
    bookkeeping.flush()
    assert done == [1]
    later = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, later.set)  # after the cancelled timer's time
    await asyncio.wait_for(later.wait(), 10)
    assert done == [1]  # not run twice
    ran = asyncio.Event()
    bookkeeping.defer(lambda: done.append(2))  # a new batch gets a new timer
    bookkeeping.defer(ran.set)
    await asyncio.wait_for(ran.wait(), 10)
    assert done == [1, 2]


async def test_a_failing_piece_does_not_lose_the_others() -> None:
    bookkeeping = Bookkeeping(delay_s=0.01)
    done: list[str] = []

    def broken() -> None:
        raise RuntimeError("a bug in bookkeeping")

    bookkeeping.defer(broken)
    bookkeeping.defer(lambda: done.append("after"))
    bookkeeping.flush()
    assert done == ["after"]

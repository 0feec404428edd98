"""Deferred bookkeeping: runs a moment later, in order, all of it, and at once when flushed."""

from __future__ import annotations

import asyncio

from proxy.ops.bookkeeping import Bookkeeping


async def test_work_runs_after_the_delay_not_before() -> None:
    bookkeeping = Bookkeeping(delay_s=0.05)
    done: list[int] = []
    bookkeeping.defer(lambda: done.append(1))
    bookkeeping.defer(lambda: done.append(2))
    await asyncio.sleep(0.01)
    assert done == []  # the loop is free for whatever arrives meanwhile
    await asyncio.sleep(0.1)
    assert done == [1, 2]


async def test_flush_runs_everything_now_and_cancels_the_timer() -> None:
    bookkeeping = Bookkeeping(delay_s=0.05)
    done: list[int] = []
    bookkeeping.defer(lambda: done.append(1))
    bookkeeping.flush()
    assert done == [1]
    await asyncio.sleep(0.1)
    assert done == [1]  # not run twice
    bookkeeping.defer(lambda: done.append(2))  # a new batch gets a new timer
    await asyncio.sleep(0.1)
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

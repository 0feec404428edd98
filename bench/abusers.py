"""Abusive clients in a process of their own: the measuring client must not share a GIL with
them, and a benchmark's processes end with it.

``abusers(make, params, threads)``: inside the block, ``threads`` threads of a spawned process
repeat the attempt ``make(*params)`` returns (given the stop event: a client holding a
connection lets go when the block ends) until the block ends; after it, the yielded dict holds
how often each status came back, 0 for a connection refused or cut.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from supervisor.process import die_with_parent

Attempt = Callable[[Any], int]
"""One abusive request, given the stop event: the status it got."""


def _abusers_process(
    make: Callable[..., Attempt],
    params: tuple[Any, ...],
    threads: int,
    pause_s: float,
    events: tuple[Any, Any, Any],
) -> None:
    die_with_parent()  # a benchmark's processes end with it, whatever ends it
    ready, stop, results = events
    attempt = make(*params)
    answers: Counter[int] = Counter()
    lock = threading.Lock()

    def loop() -> None:
        while not stop.is_set():
            try:
                status = attempt(stop)
            except OSError:
                status = 0
                time.sleep(pause_s)  # the proxy refuses connections: do not spin
            with lock:
                answers[status] += 1

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    ready.set()
    stop.wait()
    for worker in workers:
        worker.join(60)
    results.put(dict(answers))


@contextlib.contextmanager
def abusers(
    make: Callable[..., Attempt],
    params: tuple[Any, ...],
    threads: int,
    *,
    name: str,
    pause_s: float = 0.0,
) -> Iterator[dict[int, int]]:
    """``threads`` abusers (``name`` in errors) while inside; then the statuses they got.
    ``make`` is a module-level function (the spawned process imports it by name); ``pause_s``:
    the wait after a refused or cut connection."""
    context = multiprocessing.get_context("spawn")
    events = (context.Event(), context.Event(), context.Queue())
    process = context.Process(
        target=_abusers_process, args=(make, params, threads, pause_s, events), daemon=True
    )
    process.start()
    ready, stop, results = events
    answers: dict[int, int] = {}
    try:
        if not ready.wait(120):
            raise RuntimeError(f"the {name} abusers did not start")
        yield answers
    finally:
        stop.set()
        answers.update(results.get(timeout=120))
        process.join(30)

"""Helpers of the supervisor's tests: shrunk timings, child specs, a recorder of state changes,
a running supervisor, and whether a process is still there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from supervisor import Backend, BackendSpec, BackendState, Supervisor, SupervisorSettings
from supervisor.states import TRANSITIONS
from tests.support.backend_child import backend_argv

S = BackendState
FAST = {
    "health_interval_s": 0.1,
    "health_timeout_s": 0.25,
    "ready_poll_s": 0.02,
    "unhealthy_after_s": 0.5,
    "replace_after_s": 0.5,
    "ready_timeout_s": 10.0,
    "stop_timeout_s": 1.0,
    "drain_timeout_s": 1.0,
    "stagger_s": 0.0,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 1.0,
    "crash_loop_count": 3,
    "crash_loop_window_s": 30.0,
}


def spec(name: str, *flags: str) -> BackendSpec:
    return BackendSpec(name=name, model="m", profile="off", argv=backend_argv(*flags), env={})


@dataclass(frozen=True)
class Change:
    t: float
    name: str
    ident: int
    state: BackendState
    reason: str
    pid: int | None


class Recorder:
    """The on_change callback: records every change, lets a test wait for one."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self._event = asyncio.Event()

    def __call__(self, backend: Backend) -> None:
        self.changes.append(
            Change(
                time.monotonic(),
                backend.name,
                id(backend),
                backend.state,
                backend.state_reason,
                backend.pid,
            )
        )
        self._event.set()
        self._event = asyncio.Event()

    async def wait(
        self, name: str, state: BackendState, *, start: int = 0, timeout: float = 5.0
    ) -> Change:
        async with asyncio.timeout(timeout):
            while True:
                event = self._event
                for change in self.changes[start:]:
                    if change.name == name and change.state is state:
                        return change
                await event.wait()

    def states(self, name: str, start: int = 0) -> list[BackendState]:
        return [c.state for c in self.changes[start:] if c.name == name]

    def check_order(self) -> None:
        """Every recorded change of each backend object is an allowed transition."""
        last: dict[int, BackendState] = {}
        for change in self.changes:
            before = last.get(change.ident, S.STOPPED)
            assert change.state in TRANSITIONS[before], f"{before} -> {change.state}"
            last[change.ident] = change.state


@contextlib.asynccontextmanager
async def running(
    specs: list[BackendSpec],
    recorder: Recorder | None = None,
    *,
    in_flight: Callable[[str], int] | None = None,
    **overrides: float,
) -> AsyncIterator[Supervisor]:
    settings = SupervisorSettings.model_validate(FAST | overrides)
    supervisor = Supervisor(specs, settings, on_change=recorder, in_flight=in_flight)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()
        if recorder is not None:
            recorder.check_order()


def alive(pid: int) -> bool:
    """Running (not a zombie): some container init processes never reap orphans."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False

"""Fail fast: a model whose every backend failed before it was ever ready stops the proxy.

Restarting such a model cannot help (a missing file, a GGUF without MTP layers, a missing
library, a flag the build does not know), and a proxy that stays up without it answers 503
forever while systemd waits TimeoutStartSec for a READY that never comes. So during start-up
(until every model had a ready backend, when READY=1 is sent) the supervisor's verdict, FAILED
after its crash loop, ends the proxy: exit status 3, READY never sent, one line naming the model
and the cause read from its backends' last lines (supervisor.causes). A model that was ready
once keeps the supervisor's restarts, and so does any model after start-up (a reload's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from supervisor.backend import Backend
from supervisor.causes import diagnose, telling_line
from supervisor.states import BackendState

EXIT_STATUS = 3
"""`mtp-proxy serve`'s exit status when a model cannot start (2: the configuration is invalid)."""


class ModelCannotStartError(Exception):
    """Raised by `serve` after the shutdown when a model could not start; str() is the line."""


class StartupWatch:
    """Which models had a ready backend since start-up, and the first one that never can."""

    def __init__(self) -> None:
        self._ready_once: set[str] = set()
        self._verdict = asyncio.Event()
        self.failure: str | None = None

    def saw_ready(self, model: str) -> None:
        self._ready_once.add(model)

    def judge(self, model: str, backends: Sequence[Backend]) -> str | None:
        """The line saying why `model` cannot start, when every one of its backends is FAILED
        and none was ever ready; None otherwise. The first such line is kept as `failure`."""
        mine = [b for b in backends if b.spec.model == model]
        if model in self._ready_once or not mine:
            return None
        if any(b.state is not BackendState.FAILED for b in mine):
            return None
        line = cannot_start_line(model, mine)
        if self.failure is None:
            self.failure = line
            self._verdict.set()
        return line

    async def wait(self) -> None:
        """Returns once a model was found unable to start."""
        await self._verdict.wait()


def cannot_start_line(model: str, backends: Sequence[Backend]) -> str:
    """One line: the model, what its backends' crash loop was, the cause and what to do."""
    first = backends[0]
    attempts = f"{first.restarts + 1} attempts, last: {_last_exit(first.state_reason)}"
    for backend in backends:
        cause = diagnose(backend.last_log_lines, backend.last_exit_code, backend.last_error)
        if cause is not None:
            return f"model {model} cannot start ({attempts}): {cause.line()}"
    quoted = telling_line(first.last_log_lines, first.last_error)
    return (
        f"model {model} cannot start ({attempts}); its backend {first.name} said: {quoted} "
        "(to see all of its output, run the command line mtp-proxy check-config prints)"
    )


def _last_exit(reason: str) -> str:
    # The FAILED state's reason reads "crash loop: N exits within Ws, last: <what happened>".
    return reason.rpartition("last: ")[2] or reason

"""Backend states and the transitions allowed between them."""

from __future__ import annotations

from enum import StrEnum


class BackendState(StrEnum):
    STARTING = "starting"  # spawned (or remote: first check pending), /health not yet 200
    READY = "ready"  # /health 200: may receive requests
    UNHEALTHY = "unhealthy"  # was ready, /health has not answered 200 for unhealthy_after_s
    STOPPING = "stopping"  # draining, then SIGTERM/SIGKILL to the process group
    STOPPED = "stopped"  # no process: stopped on request, or waiting out a restart backoff
    FAILED = "failed"  # crash loop: no more restarts until restart(name) or reload


S = BackendState

# Modelled on llama-swap's internal/process: every change goes through this table, so an
# impossible change is a bug that shows up at once rather than a confusing state later.
TRANSITIONS: dict[BackendState, frozenset[BackendState]] = {
    S.STOPPED: frozenset({S.STARTING, S.FAILED}),
    # STARTING -> STOPPED: exited (or timed out) before ready; -> UNHEALTHY: remote silent.
    S.STARTING: frozenset({S.READY, S.UNHEALTHY, S.STOPPED, S.STOPPING, S.FAILED}),
    S.READY: frozenset({S.UNHEALTHY, S.STOPPED, S.STOPPING, S.FAILED}),
    S.UNHEALTHY: frozenset({S.READY, S.STOPPED, S.STOPPING, S.FAILED}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.FAILED: frozenset({S.STARTING}),
}


class InvalidTransitionError(RuntimeError):
    def __init__(self, name: str, old: BackendState, new: BackendState) -> None:
        super().__init__(f"backend {name}: invalid state change {old} -> {new}")


def check_transition(name: str, old: BackendState, new: BackendState) -> None:
    if new not in TRANSITIONS[old]:
        raise InvalidTransitionError(name, old, new)

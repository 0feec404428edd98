"""The read-only view of one backend that the supervisor hands out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from supervisor.draft_probe import DraftControl
from supervisor.spec import BackendSpec
from supervisor.states import BackendState
from supervisor.template_check import ChatTemplateCheck


class Backend(Protocol):
    """What the proxy may read about a backend; only the Supervisor changes it.

    During a reload a changed backend briefly exists twice under one name (the new one
    starting, the old one still serving): tell them apart by identity, not by name.
    """

    @property
    def spec(self) -> BackendSpec: ...
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> BackendState: ...
    @property
    def state_reason(self) -> str: ...  # why the backend is in its state, for logs/admin
    @property
    def base_url(self) -> str | None: ...  # "http://127.0.0.1:PORT" or the remote url
    @property
    def port(self) -> int | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def crash_loops(self) -> int: ...  # times it was marked FAILED for crashing repeatedly
    @property
    def health_failures(self) -> int: ...  # /health checks failed while serving
    @property
    def last_exit_code(self) -> int | None: ...  # negative: killed by that signal
    @property
    def last_error(self) -> str | None: ...  # incl. the child's last output lines
    @property
    def started_at(self) -> float | None: ...  # time.monotonic() of the current process start
    @property
    def uptime_s(self) -> float | None: ...
    @property
    def last_log_lines(self) -> tuple[str, ...]: ...
    @property
    def draft_control(self) -> DraftControl | None: ...  # supervisor.draft_probe; None until probed
    @property
    def draft_control_reason(self) -> str | None: ...  # what the probe saw
    @property
    def chat_template(self) -> ChatTemplateCheck | None: ...  # template_check; None until checked
    def snapshot(self) -> dict[str, object]: ...  # JSON-ready, for an admin endpoint


OnChange = Callable[[Backend], None]  # called synchronously on every state change
InFlight = Callable[[str], int]  # requests in flight on the backend of that name

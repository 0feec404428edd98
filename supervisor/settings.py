"""The `[supervisor]` section: timings of health checks, restarts and stops.

The proxy's settings embed it (`proxy.config`), but it lives here because the supervisor never
imports the proxy. It follows the proxy's settings style: a description on every field.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SupervisorSettings(BaseModel):
    """Defaults: a hung backend is UNHEALTHY within ~10-15 s and replaced within ~30 s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    health_interval_s: float = Field(
        default=2.0, gt=0, description="Seconds between two /health checks of a backend."
    )
    health_timeout_s: float = Field(
        default=2.0, gt=0, description="Seconds one /health request may take."
    )
    ready_poll_s: float = Field(
        default=0.1, gt=0, description="Seconds between /health polls while a backend loads."
    )
    unhealthy_after_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds without a healthy /health answer before a ready backend is "
        "UNHEALTHY: no more traffic.",
    )
    replace_after_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds UNHEALTHY before a local backend is killed and restarted.",
    )
    ready_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a backend may take to load and answer /health.",
    )
    probe_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="Seconds the draft-control probe may take before READY (two short "
        "requests). The chat-template check (one or two /apply-template calls) gets as long.",
    )
    stop_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds from SIGTERM to SIGKILL when a backend stops."
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds requests in flight get to finish before a backend is stopped.",
    )
    stagger_s: float = Field(
        default=0.5,
        ge=0,
        description="Seconds between two backend starts, so that big models do not load at once.",
    )
    backoff_initial_s: float = Field(
        default=0.5, ge=0, description="Seconds before the first restart after an exit."
    )
    backoff_max_s: float = Field(
        default=30.0,
        ge=0,
        description="Most seconds before a restart (the delay doubles with each exit).",
    )
    crash_loop_count: int = Field(
        default=5,
        ge=1,
        description="More exits than this within crash_loop_window_s: the backend is FAILED "
        "and not restarted.",
    )
    crash_loop_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds of the window in which crash_loop_count is counted.",
    )

    @model_validator(mode="after")
    def _backoff_max_not_below_initial(self) -> Self:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self

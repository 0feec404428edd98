"""Timings of the supervisor: health checks, restarts, stops. Embedded in the proxy settings."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SupervisorSettings(BaseModel):
    """Defaults: a hung backend is UNHEALTHY within ~10-15 s and replaced within ~30 s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    health_interval_s: float = Field(2.0, gt=0, description="seconds between /health checks")
    health_timeout_s: float = Field(2.0, gt=0, description="one /health request's timeout")
    ready_poll_s: float = Field(0.1, gt=0, description="/health poll period while loading")
    unhealthy_after_s: float = Field(
        10.0, gt=0, description="no healthy /health answer this long -> UNHEALTHY"
    )
    replace_after_s: float = Field(
        15.0, gt=0, description="UNHEALTHY this long -> killed and restarted (local backends)"
    )
    ready_timeout_s: float = Field(300.0, gt=0, description="loading may take this long")
    probe_timeout_s: float = Field(
        20.0, gt=0, description="the draft-control probe before READY (two short requests)"
    )
    stop_timeout_s: float = Field(10.0, gt=0, description="SIGTERM -> SIGKILL grace period")
    drain_timeout_s: float = Field(30.0, ge=0, description="wait for in-flight requests")
    stagger_s: float = Field(0.5, ge=0, description="pause between spawns at start")
    backoff_initial_s: float = Field(0.5, ge=0, description="first restart delay after an exit")
    backoff_max_s: float = Field(30.0, ge=0, description="restart delay cap (doubles per exit)")
    crash_loop_count: int = Field(5, ge=1, description="more exits than this in the window...")
    crash_loop_window_s: float = Field(60.0, gt=0, description="...-> FAILED, no more restarts")

    @model_validator(mode="after")
    def _check_backoff(self) -> Self:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self

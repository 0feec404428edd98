"""Settings defaults and the state-transition table."""

from __future__ import annotations

import pydantic
import pytest

from supervisor.settings import SupervisorSettings
from supervisor.states import (
    TRANSITIONS,
    BackendState,
    InvalidTransitionError,
    check_transition,
)

S = BackendState


def test_defaults_detect_a_hang_within_15s_and_replace_within_30s() -> None:
    s = SupervisorSettings()
    # Worst case: the last good answer, then health checks every interval, each up to its timeout.
    assert s.unhealthy_after_s + s.health_interval_s + s.health_timeout_s <= 15
    # Detection, then the wait to replace, then a restart (~1 s for a loaded model's process).
    assert s.unhealthy_after_s + s.health_interval_s + s.health_timeout_s + s.replace_after_s <= 29
    assert s.stop_timeout_s == 10 and s.drain_timeout_s == 30
    assert (s.crash_loop_count, s.crash_loop_window_s) == (5, 60)


def test_settings_are_validated() -> None:
    with pytest.raises(pydantic.ValidationError, match="backoff_max_s"):
        SupervisorSettings(backoff_initial_s=5, backoff_max_s=1)
    with pytest.raises(pydantic.ValidationError):
        SupervisorSettings(health_interval_s=0)
    with pytest.raises(pydantic.ValidationError):
        SupervisorSettings.model_validate({"no_such_setting": 1})


def test_every_state_has_a_row_and_stopping_only_ends_in_stopped() -> None:
    assert set(TRANSITIONS) == set(BackendState)
    assert TRANSITIONS[S.STOPPING] == {S.STOPPED}
    assert S.READY not in TRANSITIONS[S.FAILED]  # a failed backend must start again first
    check_transition("b", S.STARTING, S.READY)
    with pytest.raises(InvalidTransitionError, match="b: invalid state change stopped -> ready"):
        check_transition("b", S.STOPPED, S.READY)

"""The supervisor refuses a duplicate or unknown backend name before anything runs (the
supervisor on real processes: tests/supervisor/test_supervisor.py)."""

from __future__ import annotations

import pytest

from supervisor import BackendState, Supervisor, SupervisorSettings
from tests.support.supervised import FAST, spec

S = BackendState


async def test_names_must_be_unique_and_known() -> None:
    settings = SupervisorSettings.model_validate(FAST)
    with pytest.raises(ValueError, match="duplicate backend name 'a'"):
        Supervisor([spec("a"), spec("a")], settings)
    supervisor = Supervisor([spec("a")], settings)
    with pytest.raises(KeyError, match="no backend named 'x'"):
        await supervisor.restart("x")
    assert supervisor.backend("a").state is S.STOPPED  # nothing runs before start()
    await supervisor.stop()

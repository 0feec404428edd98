"""One backend process for one draft setting, started and stopped by the supervisor's Child.

The command line is the one the proxy would run for a profile of that setting
(``proxy.plans.plan.backend_specs_of``: the model's args, the setting's draft flags), so tune
measures what serving will run. Processes are started one at a time: never more than one copy
of the weights in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from proxy.config.settings import ModelSettings, ProfileSettings
from proxy.plans.plan import backend_specs_of
from proxy.tune.plan.grid import DraftSetting
from supervisor.child import Child
from supervisor.settings import SupervisorSettings
from supervisor.states import BackendState

_ENDED = (BackendState.READY, BackendState.FAILED, BackendState.STOPPED)


class LaunchError(RuntimeError):
    """The backend did not become ready; the message quotes its last output."""


def profile_of(model: ModelSettings, setting: DraftSetting) -> ProfileSettings:
    """A profile of the model with this setting; keeps the first profile's env (the GPU)."""
    env = model.profiles[0].env if model.profiles else {}
    fields = setting.profile_fields()
    return ProfileSettings(name=f"tune-{setting.name}", env=dict(env), **fields)


@asynccontextmanager
async def running(
    model: ModelSettings,
    setting: DraftSetting,
    supervisor: SupervisorSettings,
    session: aiohttp.ClientSession,
) -> AsyncIterator[Child]:
    """The setting's backend, READY; stopped (TERM, then KILL) when the block ends."""
    spec = backend_specs_of(model, profile_of(model, setting))[0]
    if spec.is_remote:
        raise LaunchError(f"model {model.name}: tune starts its own processes, not a url")
    child = Child(spec, supervisor)
    try:
        await child.start(session)
        await child.wait_for(_ENDED, supervisor.ready_timeout_s + supervisor.stop_timeout_s)
        if child.state is not BackendState.READY:
            why = child.last_error or child.state_reason
            raise LaunchError(f"{setting.label}: backend not ready ({child.state}): {why}")
        yield child
    finally:
        await child.stop("tune: setting measured")

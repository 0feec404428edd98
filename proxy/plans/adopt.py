"""Adopting plans: the running proxy follows ``state.plans``.

The router learns which models take their profiles as per-request depths; LiveBackends lists
every backend the plans call for (a new one as STARTING, so its model answers 503 while it
loads, not 404); the supervisor runs them. Start-up (``proxy.app``), a SIGHUP reload
(``proxy.lifecycle.reload``) and auto's fallback (``proxy.plans.auto``) all adopt plans here.
"""

from __future__ import annotations

from proxy.plans.plan import backend_slots, backend_specs
from proxy.plans.speculation import backend_speculation
from proxy.routing.router import PerRequestModel
from proxy.state import ProxyState
from supervisor.spec import BackendSpec
from supervisor.states import BackendState

Specs = dict[str, BackendSpec]  # by backend name


def apply_plans(state: ProxyState) -> None:
    """Tell the router which models take their profiles per request."""
    state.router.per_request = {
        model.name: PerRequestModel(dict(plan.depths), model.mixed_depths)
        for model in state.settings.models
        if (plan := state.plans[model.name]).per_request
    }


def register_backends(state: ProxyState) -> tuple[list[BackendSpec], dict[str, int]]:
    """The backends the plans call for, and their slots; each one LiveBackends does not list
    yet is added as STARTING. The answers' X-MTP-Spec-Type learns what each one drafts with."""
    state.speculation = backend_speculation(state.settings, state.plans)
    specs = backend_specs(state.settings, state.plans)
    slots = backend_slots(state.settings, state.plans)
    for spec in specs:
        if state.backends.get(spec.name) is None:
            state.backends.update(
                spec, BackendState.STARTING, base_url=None, slots=slots[spec.name]
            )
    return specs, slots


async def adopt_plans(state: ProxyState) -> tuple[Specs, Specs]:
    """Make the running backends those of the plans: LiveBackends first (before any await, so
    no request sees a new model without its backends), then the supervisor's reload (unchanged
    ones keep running, a changed one is replaced start-first), then removed backends are
    forgotten and the others take their new slots. Returns the backends before and after, by
    name (none before without a supervisor).

    The router's view (``apply_plans``) is the caller's: auto's fallback keeps its model out
    of the per-request ones from the moment the probe answered."""
    specs, slots = register_backends(state)
    wanted = {spec.name: spec for spec in specs}
    supervisor = state.supervisor
    if supervisor is None:
        return {}, wanted
    before = {backend.name: backend.spec for backend in supervisor.backends}
    await supervisor.reload(specs)
    for name in before.keys() - wanted.keys():
        state.backends.remove(name)  # only now: a removed backend's drain reads its in_flight
    running = {backend.name: backend.spec for backend in supervisor.backends}
    for name, count in slots.items():
        # A changed backend whose successor failed serves on as its old process, with the
        # slots that process was started with.
        backend = state.backends.get(name)
        if running.get(name) == wanted[name] and backend is not None:
            backend.slots = count
    return before, wanted

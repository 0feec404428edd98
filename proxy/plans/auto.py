"""auto's decision: once the first process of an auto model is probed, keep it or fall back.

``draft_control = "auto"`` starts one process per model (per replica) at the deepest depth. The
supervisor probes a backend before it publishes it READY (`supervisor.draft_probe`); its verdict is
read here the moment the backend turns READY:

- ``per-request``: the plan stands; the profiles stay per-request depths.
- ``undecided`` (the probe drafted nothing, with or without the field): the plan stands too,
  with a warning. Nothing was drafted to tell by, and nothing is lost by staying: a backend that
  ignores the field drafts every request at its start-up depth, while a pool of processes that
  draft nothing would only cost memory.
- ``ignored`` / ``none`` (or a failed probe, which counts as ignored): the one process cannot
  take a depth per request. The model falls back to the pool if it fits in memory (the running
  process's share counted as freed), else to one process at the single best setting. The running
  process is stopped first (on one GPU two copies may not fit), and requests wait in the model's
  queue until the new processes are ready.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import structlog

from proxy.config.settings import ModelSettings
from proxy.plans.adopt import adopt_plans
from proxy.plans.plan import ONE_PROCESS, ModelPlan, describe_plan, resolve_auto
from proxy.plans.preflight import pool_fits
from proxy.state import ProxyState
from supervisor.backend import Backend
from supervisor.draft_probe import DraftControl

log = structlog.get_logger("proxy.plan")


def on_ready(state: ProxyState, backend: Backend) -> None:
    """A backend turned READY: settle its model's plan if auto was waiting for this probe."""
    plan = state.plans.get(backend.spec.model)
    if plan is None or not plan.per_request:
        return
    if plan.decided:
        if backend.draft_control != "per-request":  # draft_control per-request, set by hand
            log.warning(
                "depth_not_honoured",
                model=plan.model,
                backend=backend.name,
                draft_control=backend.draft_control,
                probe_reason=backend.draft_control_reason,
                message="draft_control is per-request but this backend's probe did not see it "
                "honour speculative.n_max: a backend that ignores it runs every request at its "
                "start-up depth",
            )
        return
    model = next(m for m in state.settings.models if m.name == plan.model)
    verdict, reason = backend.draft_control, backend.draft_control_reason
    if verdict in ("per-request", "undecided"):
        state.plans[model.name] = resolve_auto(model, verdict, None, "")
        if verdict == "undecided":
            log.warning(
                "plan_undecided",
                model=model.name,
                backend=backend.name,
                probe_reason=reason,
                message="the probe drafted nothing, so it cannot tell whether the backend "
                "honours speculative.n_max: the one process stays",
            )
        log.info("plan", model=model.name, shape="one-process", why=state.plans[model.name].reason)
        return
    probe: DraftControl = "none" if verdict == "none" else "ignored"  # unprobed: not honoured
    log.warning(
        "plan_fallback",
        model=model.name,
        backend=backend.name,
        draft_control=verdict,
        probe_reason=reason,
        message="the backend does not honour speculative.n_max per request",
    )
    state.replanning.add(model.name)
    del state.router.per_request[model.name]  # until replaced: served as it runs
    state.plans[model.name] = replace(plan, decided=True)
    # Not a background task the shutdown cancels: cancelled inside Supervisor.reload it would
    # leave a backend half stopped. Supervisor.stop waits for the reload instead (its lock),
    # and the app awaits this task after stopping the supervisor.
    task = asyncio.get_running_loop().create_task(_fall_back(state, model, plan, probe))
    state.replans.add(task)
    task.add_done_callback(state.replans.discard)


def on_replaced(state: ProxyState, backend: Backend) -> None:
    """A backend of a model being re-planned turned READY: its requests stop waiting for it."""
    if backend.spec.profile != ONE_PROCESS:
        state.replanning.discard(backend.spec.model)


async def _fall_back(
    state: ProxyState, model: ModelSettings, running: ModelPlan, probe: DraftControl
) -> None:
    fits, note = await asyncio.to_thread(pool_fits, model, running)
    plan = resolve_auto(model, probe, fits, note)
    log.warning("plan", model=model.name, shape=plan.shape, why=plan.reason)
    for line in describe_plan(model, plan):
        log.info("plan_detail", model=model.name, line=line)
    state.plans[model.name] = plan
    await adopt_plans(state)

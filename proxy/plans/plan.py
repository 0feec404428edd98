"""The plan: how each model's profiles are served, and the backend processes that follow.

Two shapes serve the profiles (docs/architecture.md, "Plans"):

- **one process** (shape ``one-process``): one llama-server per model (or one per replica, e.g.
  per GPU) started at the deepest depth any profile needs; a profile is then the per-request field
  ``"speculative.n_max"`` (``off`` = 0, ``min``/``max`` = their ``draft_n_max``). One copy of the
  weights and one prefix cache, so changing depth costs nothing.
- **pool**: one process per profile, each with its own copy (where memory allows).

A third, ``single``, is the fallback of ``auto`` when the backend ignores the per-request field
and the pool does not fit: one process at the single best setting (``fallback_profile``).

``draft_control`` chooses: ``per-request`` (one process), ``per-process`` (the pool) or ``auto``
(one process first; once its probe tells, it stays if the field is honoured, else the pool if it
fits, else ``single``; a probe that drafted nothing cannot tell, and the one process stays).
n_min / p_min are not per-request (the patch makes only n_max so): the process starts with the
deepest profile's, and the plan says so for the others.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from proxy.config.settings import ModelSettings, ProfileSettings, Settings
from supervisor.commandline import llama_server_argv, resolve_llama_server
from supervisor.draft_probe import DraftControl
from supervisor.spec import BackendSpec

Shape = Literal["one-process", "pool", "single"]
ONE_PROCESS = "one-process"  # the profile label (and name part) of a one-process backend


@dataclass(frozen=True)
class ModelPlan:
    """How one model is served, and why."""

    model: str
    shape: Shape
    reason: str
    depths: Mapping[str, int] = field(default_factory=dict)
    """one-process: each profile's per-request depth. Empty for the other shapes."""
    start_depth: int = 0
    single_profile: str | None = None
    notes: tuple[str, ...] = ()
    decided: bool = True
    """False while auto waits for the probe of its first process."""

    @property
    def per_request(self) -> bool:
        return self.shape == "one-process"


@dataclass(frozen=True)
class Process:
    """One backend process of the plan, described as a profile (what the spec is built from)."""

    name: str
    label: str  # the backend's profile label: a profile name, or ONE_PROCESS
    profile: ProfileSettings


def initial_plan(model: ModelSettings) -> ModelPlan:
    """The plan at start-up, before any probe has answered."""
    if model.draft_control == "per-process":
        return ModelPlan(model.name, "pool", "draft_control per-process")
    problems = model.one_process_problems()
    if problems:  # per-request with problems does not validate: this is auto
        return ModelPlan(model.name, "pool", "auto: " + "; ".join(problems))
    if model.draft_control == "auto" and not _depth_choice(model):
        return ModelPlan(model.name, "pool", "auto: one depth only, nothing to choose per request")
    if model.draft_control == "per-request":
        return _one_process(model, "draft_control per-request")
    return _one_process(
        model,
        "auto: one process first; its probe decides (per-request if honoured, else the pool "
        "if it fits, else one process at the best single setting)",
        decided=False,
    )


def resolve_auto(
    model: ModelSettings, probe: DraftControl, pool_fits: bool | None, memory_note: str
) -> ModelPlan:
    """auto, once the first process's probe answered: keep it, or fall back."""
    if probe == "per-request":
        return _one_process(model, "auto: the probe says the backend honours the depth field")
    if probe == "undecided":
        return _one_process(
            model,
            "auto: the probe drafted nothing, with the depth field or without, so it cannot "
            "tell; the one process stays (if the backend ignores the field, every request "
            "drafts at its start-up depth)",
        )
    why = f"auto: the probe says {probe!r} (the backend ignores speculative.n_max)"
    if pool_fits is not False:
        return ModelPlan(model.name, "pool", f"{why}; the pool fits ({memory_note})")
    chosen = fallback_profile(model)
    return ModelPlan(
        model.name,
        "single",
        f"{why}; the pool does not fit ({memory_note}): one process at {chosen.name}",
        single_profile=chosen.name,
    )


def _depth_choice(model: ModelSettings) -> bool:
    return len({model.profile_depth(p) for p in model.profiles}) >= 2


def fallback_profile(model: ModelSettings) -> ProfileSettings:
    """The single best setting when only one process fits and depth is not per-request:
    `fallback_profile`, else the profile named min (the safe middle: ~0.97x on long code, most
    of the short-chat gain: docs/routing.md), else the deepest."""
    by_name = {p.name: p for p in model.profiles}
    if model.fallback_profile is not None:
        return by_name[model.fallback_profile]
    if "min" in by_name:
        return by_name["min"]
    return max(model.profiles, key=model.profile_depth)


def _one_process(model: ModelSettings, reason: str, *, decided: bool = True) -> ModelPlan:
    start = model.start_depth()
    depths = {p.name: model.profile_depth(p) for p in model.profiles}
    return ModelPlan(
        model.name,
        "one-process",
        reason,
        depths=depths,
        start_depth=start,
        notes=tuple(_draft_notes(model, start)),
        decided=decided,
    )


def _deepest(model: ModelSettings) -> ProfileSettings:
    return max(model.profiles, key=model.profile_depth)


def _draft_notes(model: ModelSettings, start: int) -> list[str]:
    deepest = _deepest(model)
    notes = []
    for p in model.profiles:
        if p is deepest:
            continue
        unused = [
            f"{name} {value:g}"
            for name, value in (("n_min", p.draft_n_min), ("p_min", p.draft_p_min))
            if value is not None
        ]
        if unused:
            notes.append(
                f"profile {p.name}: {', '.join(unused)} not applied (only n_max is per request; "
                f"the process runs with {deepest.name}'s n_min/p_min)"
            )
    return notes


def processes(model: ModelSettings, plan: ModelPlan) -> list[Process]:
    """The backend processes of a model under a plan."""
    if plan.shape == "pool":
        return [
            Process(name, p.name, p.model_copy(update={"env": {**model.env, **p.env}}))
            for p in model.profiles
            for name in _replica_names(f"{model.name}/{p.name}", p.replicas)
        ]
    if plan.shape == "single":
        chosen = next(p for p in model.profiles if p.name == plan.single_profile)
        return _replicated(model, chosen, chosen.name)
    deepest = _deepest(model)
    draft = deepest.draft()
    own_n_max = "--spec-draft-n-max" in model.args
    process = ProfileSettings(
        name=ONE_PROCESS,
        spec_type=None if draft.is_off else draft.spec_type,
        draft_n_max=None if draft.is_off or own_n_max else plan.start_depth,
        draft_n_min=draft.n_min,
        draft_p_min=draft.p_min,
        draft_model=draft.draft_model,
    )
    return _replicated(model, process, ONE_PROCESS)


def _replicated(model: ModelSettings, profile: ProfileSettings, label: str) -> list[Process]:
    names = _replica_names(f"{model.name}/{label}", model.replicas)
    envs = model.replica_env or [{}] * model.replicas
    return [
        Process(name, label, profile.model_copy(update={"env": {**model.env, **env}}))
        for name, env in zip(names, envs, strict=True)
    ]


def _replica_names(base: str, replicas: int) -> list[str]:
    return [base] if replicas == 1 else [f"{base}#{n + 1}" for n in range(replicas)]


def plans_of(settings: Settings) -> dict[str, ModelPlan]:
    return {model.name: initial_plan(model) for model in settings.models}


def backend_specs(
    settings: Settings, plans: Mapping[str, ModelPlan] | None = None
) -> list[BackendSpec]:
    """Every backend the supervisor runs, under the given plans (default: the initial ones)."""
    plans = plans or plans_of(settings)
    return [spec for model in settings.models for spec in model_specs(model, plans[model.name])]


def backend_slots(
    settings: Settings, plans: Mapping[str, ModelPlan] | None = None
) -> dict[str, int]:
    """Slots of every backend, by backend name (see `ModelSettings.slots_of`)."""
    plans = plans or plans_of(settings)
    return {
        process.name: model.slots_of(process.profile)
        for model in settings.models
        for process in processes(model, plans[model.name])
    }


def backend_specs_of(model: ModelSettings, profile: ProfileSettings) -> list[BackendSpec]:
    """The backends of one profile as processes of its own (the pool's), one per replica."""
    alone = model.model_copy(update={"profiles": [profile], "draft_control": "per-process"})
    return model_specs(alone, ModelPlan(model.name, "pool", "one profile"))


def model_specs(model: ModelSettings, plan: ModelPlan) -> list[BackendSpec]:
    return [
        BackendSpec(
            name=process.name,
            model=model.name,
            profile=process.label,
            argv=() if process.profile.url else tuple(_argv(model, process.profile)),
            env=dict(process.profile.env),
            url=process.profile.url,
        )
        for process in processes(model, plan)
    ]


def _argv(model: ModelSettings, profile: ProfileSettings) -> list[str]:
    simulated = model.backend == "simulator"
    binary = sys.executable if simulated else resolve_llama_server(model.binary)
    argv = llama_server_argv(
        binary,
        model.model_path or model.name,
        [*model.args, "--alias", model.name],
        profile.draft(),
        profile.args,
    )
    if simulated:
        argv[1:1] = ["-m", "simulator"]  # the twin takes llama-server's flags as they are
    return argv


def describe_plan(model: ModelSettings, plan: ModelPlan) -> list[str]:
    """The plan in words, for check-config and the start-up log."""
    count = len(processes(model, plan))
    copies = f"{count} process{'es' if count > 1 else ''}"
    if plan.shape == "one-process":
        depths = ", ".join(f"{name} = {depth}" for name, depth in plan.depths.items())
        lines = [
            f"shape: one process per replica ({copies}, one copy of the weights each), "
            f"started at depth {plan.start_depth}; profiles are per-request depths "
            f'("speculative.n_max"): {depths}',
            f"why: {plan.reason}",
        ]
        if not plan.decided:
            fallback = fallback_profile(model).name
            lines.append(
                "if the probe says the backend ignores the field (stock llama.cpp): the pool "
                f"({len(processes(model, ModelPlan(model.name, 'pool', '')))} processes) if it "
                f"fits in memory, else one process at {fallback}"
            )
        concurrent = "may differ" if model.mixed_depths else "share one depth (mixed_depths off)"
        lines.append(f"concurrent requests on one process: {concurrent}")
        return lines + [f"note: {note}" for note in plan.notes]
    if plan.shape == "single":
        return [f"shape: one process at {plan.single_profile} ({copies})", f"why: {plan.reason}"]
    return [f"shape: pool, one process per profile ({copies})", f"why: {plan.reason}"]

"""`mtp-proxy check-config`: validate a configuration as the service will run it, and say
what it will do. Exit status 2 lists every problem: invalid settings, a missing or unusable
binary, a model file that does not exist or cannot be read, a GGUF without the MTP layers its
profiles draft with, a speculative type the configured llama-server does not know (its
``--help``), a draft model missing or of the wrong kind for its type or of another vocabulary
than the model's, a learned file the service's user cannot write.

When the installed systemd unit runs this very file, its Environment= lines apply as they will
in the service (they beat the file); every setting the environment overrides is printed with
its value and where it came from, and so is the learned-statistics file in force.
"""

from __future__ import annotations

import os
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from proxy.config.overrides import (
    Variable,
    effective_learned_file,
    overrides,
    service_unit,
    service_variables,
    unit_user,
)
from proxy.config.sandbox import Sandbox, read_problem, read_sandbox, write_problem
from proxy.config.settings import ConfigError, ModelSettings, Settings, load_settings
from proxy.lifecycle.learned_file import learned_file_problem
from proxy.plans.known_types import known_type_problems
from proxy.plans.model_files import model_file_problems
from proxy.plans.plan import (
    ModelPlan,
    backend_specs,
    backend_specs_of,
    describe_plan,
    initial_plan,
    plans_of,
)
from proxy.plans.preflight import pool_fits, render, run_preflight
from proxy.plans.speculation import speculation_of
from supervisor.commandline import LlamaServerNotFoundError
from supervisor.spec import BackendSpec
from supervisor.urls import shown


def check_config(path: Path, unit: Path | None = None) -> int:
    """Print the summary of `path` (exit status 0), or its problems (exit 2). `unit`: the
    systemd unit whose environment applies (default: the installed one, if it runs `path`)."""
    variables = apply_service_environment(path, unit)
    settings = load_or_exit(path)
    problems, warnings = model_file_problems(settings)
    unknown_types, help_warnings = known_type_problems(settings)
    problems += unknown_types
    for warning in help_warnings:  # now: they say what the types were checked against
        print(f"warning: {warning}", file=sys.stderr)
    service = service_unit(path, unit)
    user = unit_user(service)  # the learned file as the service will keep it
    if (problem := learned_file_problem(settings.routing.learned_file, user)) is not None:
        problems.append(problem)
    if service is not None:
        problems += sandbox_problems(settings, read_sandbox(service))
    plans = plans_of(settings)
    specs = backends_or_exit(settings, str(path), plans, problems)
    print(f"{path}: OK")
    print(f"listen: {settings.server.host}:{settings.server.port}")
    for model in settings.models:
        aliases = f" (aliases: {', '.join(model.aliases)})" if model.aliases else ""
        print(f"model {model.name}{aliases}: {len(model.profiles)} profile(s)")
        print("\n".join(f"  {line}" for line in describe_plan(model, plans[model.name])))
        if not plans[model.name].decided:
            print(f"  {_fallback_memory(model)}")
        for spec in (s for s in specs if s.model == model.name):
            target = spec.url or " ".join([*spec.argv, "--host", "127.0.0.1", "--port", "<free>"])
            print(f"  {spec.name}: {shown(target)}")
    names = settings.model_names
    for pattern, target_model in names.patterns.items():
        print(f"model names matching {pattern!r}: {target_model}")
    print(f"any other model name: {names.default or 'refused (404)'}")
    found, unknown = overrides(settings, _file_data(path), variables)
    print("environment overrides (they beat the file):" + ("" if found else " none"))
    for override in found:
        print(f"  {override.line()}")
    print(effective_learned_file(path, variables).line())
    memory = run_preflight(settings, plans=plans)
    print("\n".join(render(memory)))
    for variable in unknown:
        print(f"warning: {variable.name} names no setting: ignored", file=sys.stderr)
    for warning in [*warnings, *memory.warnings]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def sandbox_problems(settings: Settings, sandbox: Sandbox) -> list[str]:
    """The files the unit's sandbox hides from the service (a model, a draft model, a
    binary) or keeps it from writing (the learned file), each with the drop-in that fixes it."""
    problems = []
    for m, model in enumerate(settings.models):
        if model.backend != "llama-server":
            continue
        named: dict[str, str] = {}
        if model.model_path is not None:
            named[f"models.{m}.model_path ({model.name})"] = model.model_path
        if model.binary is not None:
            named[f"models.{m}.binary ({model.name})"] = model.binary
        for p, profile in enumerate(model.profiles):
            if profile.url is None and (draft := speculation_of(model, profile).draft_model):
                named[f"models.{m}.profiles.{p}.draft_model ({model.name})"] = draft
        for where, file in named.items():
            problem = read_problem(sandbox, Path(file).expanduser().absolute())
            problems += [] if problem is None else [f"{where}: {problem}"]
    state = settings.routing.learned_file
    if state is not None and (problem := write_problem(sandbox, state.absolute())) is not None:
        problems.append(f"routing.learned_file: {problem}")
    return problems


def load_or_exit(path: Path | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        raise SystemExit(2) from None


def backends_or_exit(
    settings: Settings,
    source: str,
    plans: dict[str, ModelPlan] | None = None,
    problems: list[str] | None = None,
) -> list[BackendSpec]:
    """Every backend's command line; exit 2 listing every profile that has none (a missing
    or non-executable binary, a flag the supervisor owns) and the other `problems`, as for an
    invalid file."""
    problems = list(problems or [])
    for m, model in enumerate(settings.models):
        for p, profile in enumerate(model.profiles):
            try:
                backend_specs_of(model, profile)
            except (LlamaServerNotFoundError, OSError, ValueError) as exc:
                problems.append(f"models.{m}.profiles.{p} ({model.name}/{profile.name}): {exc}")
    if problems:
        print(ConfigError(source, problems).render(), file=sys.stderr)
        raise SystemExit(2)
    return backend_specs(settings, plans)


def apply_service_environment(path: Path, unit: Path | None = None) -> dict[str, Variable]:
    """Set this process's environment as the service's will be when the installed unit runs
    `path` (or `unit`, when named): its MTP_PROXY_* variables over this shell's. Returns every
    MTP_PROXY_* variable then in force (service_variables). For the short-lived commands that
    read a config as the service will (check-config, status)."""
    variables = service_variables(path, os.environ, unit)
    for variable in variables.values():
        os.environ[variable.name] = variable.value
    return variables


def _file_data(path: Path | None) -> dict[str, Any]:
    """The file as written (for "the file says ..."); the checks already read it once."""
    if path is None:
        text = resources.files("proxy.config").joinpath("default.toml").read_text("utf-8")
    else:
        text = path.read_text("utf-8")
    return tomllib.loads(text)


def _fallback_memory(model: ModelSettings) -> str:
    """What auto's fallback would need: the pool's memory against what is free."""
    fits, note = pool_fits(model, initial_plan(model))
    verdict = {True: "fits", False: "does not fit", None: "fit unknown"}[fits]
    return f"the pool {verdict}: {note}"

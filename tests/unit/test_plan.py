"""The plan: which shape serves a model's profiles (one process or the pool), and its processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config.settings import ConfigError, ModelSettings, Settings, load_settings
from proxy.plans.plan import (
    backend_specs,
    describe_plan,
    initial_plan,
    model_specs,
    plans_of,
    resolve_auto,
)
from proxy.plans.preflight import pool_fits
from supervisor.memory import GIB
from tests.support.plan_config import OFF_MIN_MAX, write


def model(**fields: Any) -> ModelSettings:
    return ModelSettings(**{"name": "m", "backend": "simulator", "profiles": OFF_MIN_MAX, **fields})


def test_per_request_is_one_process_at_the_deepest_depth() -> None:
    m = model(draft_control="per-request")
    plan = initial_plan(m)
    assert plan.shape == "one-process" and plan.decided
    assert dict(plan.depths) == {"off": 0, "min": 2, "max": 3}
    (spec,) = model_specs(m, plan)
    argv = list(spec.argv)
    assert (spec.name, spec.profile) == ("m/one-process", "one-process")
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"
    # n_min is not per request: the process runs with the deepest profile's (none here).
    assert "--spec-draft-n-min" not in argv
    assert any("min: n_min 1 not applied" in note for note in plan.notes)


def test_a_profile_without_draft_n_max_has_llama_servers_default_depth() -> None:
    m = model(profiles=[{"name": "off"}, {"name": "deep", "spec_type": "draft-mtp"}])
    assert dict(initial_plan(m).depths) == {"off": 0, "deep": 3}


def test_per_process_is_the_pool() -> None:
    m = model(draft_control="per-process")
    specs = model_specs(m, initial_plan(m))
    assert [s.name for s in specs] == ["m/off", "m/min", "m/max"]


def test_replicas_each_with_their_own_environment() -> None:
    envs = [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    m = model(draft_control="per-request", env={"A": "1"}, replica_env=envs)
    specs = model_specs(m, initial_plan(m))
    assert [s.name for s in specs] == ["m/one-process#1", "m/one-process#2"]
    assert [dict(s.env) for s in specs] == [{"A": "1", **env} for env in envs]


def test_replicas_that_disagree_with_replica_env_are_an_error() -> None:
    with pytest.raises(ValueError, match="replica_env has 1 entries"):
        model(replicas=2, replica_env=[{"CUDA_VISIBLE_DEVICES": "0"}])


def test_auto_starts_one_process_until_the_probe_tells() -> None:
    plan = initial_plan(model())
    assert plan.shape == "one-process" and not plan.decided


def test_auto_keeps_the_pool_where_profiles_are_processes_of_their_own() -> None:
    profiles = [{**p, "env": {"CUDA_VISIBLE_DEVICES": str(i)}} for i, p in enumerate(OFF_MIN_MAX)]
    plan = initial_plan(model(profiles=profiles))
    assert plan.shape == "pool"
    assert "own args/env" in plan.reason


def test_auto_with_one_depth_only_is_not_per_request() -> None:
    assert initial_plan(model(profiles=[{"name": "off"}])).shape == "pool"


def test_per_request_refuses_profiles_that_need_a_process() -> None:
    profiles = [{"name": "off", "url": "http://10.0.0.1:1"}, *OFF_MIN_MAX[1:]]
    with pytest.raises(ValueError, match="per-request: profile off is a remote backend"):
        model(draft_control="per-request", profiles=profiles)


def test_auto_resolution_follows_the_probe_and_the_memory() -> None:
    m = model()
    assert resolve_auto(m, "per-request", None, "").shape == "one-process"
    pool = resolve_auto(m, "ignored", True, "fits")
    assert pool.shape == "pool" and "ignores speculative.n_max" in pool.reason
    single = resolve_auto(m, "ignored", False, "12 GiB over")
    assert (single.shape, single.single_profile) == ("single", "min")
    (spec,) = model_specs(m, single)
    assert spec.name == "m/min"
    assert resolve_auto(model(fallback_profile="max"), "none", False, "").single_profile == "max"
    # Unknown memory (no nvidia-smi): the pool, as before this change.
    assert resolve_auto(m, "ignored", None, "unknown").shape == "pool"


def test_auto_keeps_the_one_process_when_the_probe_drafted_nothing() -> None:
    # Nothing drafted, with the field or without: nothing tells that the field is ignored, and
    # a pool of processes that draft nothing would only cost memory.
    m = model()
    for fits in (True, False, None):
        plan = resolve_auto(m, "undecided", fits, "")
        assert plan.shape == "one-process" and plan.decided, plan
        assert plan.depths == {"off": 0, "min": 2, "max": 3}
        assert "drafted nothing" in plan.reason and "cannot tell" in plan.reason


def test_pool_fits_counts_the_running_copy_as_freed(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    with path.open("wb") as handle:
        handle.truncate(8 * GIB)
    m = ModelSettings(
        name="m",
        model_path=str(path),
        args=["-c", "8192"],
        profiles=OFF_MIN_MAX,
    )
    running = initial_plan(m)
    fits, note = pool_fits(m, running, lambda: [int(20 * GIB)])  # + ~9 GiB of its own
    assert fits is True, note
    fits, note = pool_fits(m, running, lambda: [int(5 * GIB)])
    assert fits is False and "available once the running process stops" in note
    assert pool_fits(m, running, lambda: None)[0] is None


def test_a_profile_deeper_than_the_start_up_depth_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, draft_n_max=2))
    assert "profile max: depth 3 is above the process's start-up depth 2" in caught.value.render()
    own_flag = write(tmp_path, args=["--spec-draft-n-max", "2"], draft_control="per-request")
    with pytest.raises(ConfigError, match="problem"):
        load_settings(own_flag)
    # The pool has no shared start-up depth: each profile is its own process.
    assert load_settings(write(tmp_path, draft_n_max=2, draft_control="per-process"))


def test_describe_plan_of_the_pool_and_the_fallback() -> None:
    m = model(draft_control="per-process")
    pool = describe_plan(m, initial_plan(m))
    assert pool[0] == "shape: pool, one process per profile (3 processes)"
    single = resolve_auto(model(), "ignored", False, "")
    assert describe_plan(model(), single)[0] == "shape: one process at min (1 process)"


def test_backend_specs_follow_the_given_plans() -> None:
    settings = Settings(models=[{"name": "m", "backend": "simulator", "profiles": OFF_MIN_MAX}])
    plans = plans_of(settings)
    assert [s.name for s in backend_specs(settings, plans)] == ["m/one-process"]
    plans["m"] = resolve_auto(settings.models[0], "ignored", True, "")
    assert [s.name for s in backend_specs(settings, plans)] == ["m/off", "m/min", "m/max"]

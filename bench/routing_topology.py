"""How the routing benchmark's backends are laid out: the proxy configuration of each run.

- ``one-process`` (the default; the single-GPU shape): one simulated llama-server (one copy of the
  weights), started at the deepest depth, serving the profiles off / min / max as per-request
  depths 0 / 2 / 3 (``draft_control = "per-request"``: the proxy injects ``"speculative.n_max"``).
  ``static:<p>`` pins every request to profile p on that one process; ``pool`` is the adaptive
  policy on today's three-process pool, as a reference row at three times the VRAM.
- ``pool``: one simulated llama-server per profile (``draft_control = "per-process"``), each with
  its own weights and cache. ``static:<p>`` runs three replicas of p (the same hardware as the
  off/min/max pool of the other policies) unless ``static_pool = "shared"``.

Every topology is a function from (policy, BenchConfig) to a proxy config; adding one is adding a
function to ``TOPOLOGIES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODEL = "mtp-demo"
ADMIN_KEY = "bench-routing-admin"
STATIC_PREFIX = "static:"
PROFILES: dict[str, dict[str, Any]] = {
    "off": {"name": "off"},
    "min": {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    "max": {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
}
DEPTHS = {"off": 0, "min": 2, "max": 3}  # a profile's per-request depth on one process
POOL_ROW = "pool"  # one-process's reference row: adaptive on the three-process pool
NO_DETECTION = "adaptive-nodetect"  # adaptive without change detection (the re-learn run's)


@dataclass(frozen=True)
class BenchConfig:
    preset: str
    time_scale: float
    topology: str = "one-process"
    slots: int = 4
    seed: int = 1
    static_pool: str = "replicas"
    profile_args: dict[str, list[str]] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)  # extra [routing] settings
    change: str | None = None
    """The re-learn run on one process: the --acceptance-scale its backend takes at the trace's
    change (POST /sim/acceptance-scale), e.g. "code=0.2"."""


def _sim_args(cfg: BenchConfig) -> list[str]:
    args = ["--preset", cfg.preset, "--time-scale", f"{cfg.time_scale:g}", "-np"]
    return [*args, str(cfg.slots), "--seed", str(cfg.seed), "-c", "262144"]


def pool_model(policy: str, cfg: BenchConfig) -> dict[str, Any]:
    """One process per profile; a static policy gets three replicas of its profile."""
    names = list(PROFILES)
    replicas = 1
    if policy.startswith(STATIC_PREFIX) and cfg.static_pool == "replicas":
        names, replicas = [policy.removeprefix(STATIC_PREFIX)], len(PROFILES)
    profiles = []
    for name in names:
        profile = {**PROFILES[name], "replicas": replicas}
        if cfg.profile_args.get(name):
            profile["args"] = list(cfg.profile_args[name])
        profiles.append(profile)
    model = {"name": MODEL, "backend": "simulator", "args": _sim_args(cfg), "profiles": profiles}
    if not _knows_draft_control():
        return model  # a proxy from before per-request depths: every model is a pool
    return {**model, "draft_control": "per-process"}


def one_process_model(policy: str, cfg: BenchConfig) -> dict[str, Any]:
    """One process at the deepest depth; the profiles are per-request depths on it."""
    if policy == POOL_ROW:
        return pool_model("adaptive", cfg)
    if cfg.profile_args:
        raise ValueError("one-process: per-profile simulator args need the pool topology")
    if not _knows_draft_control():
        raise ValueError("one-process needs a proxy with per-request depths (draft_control)")
    return {
        "name": MODEL,
        "backend": "simulator",
        "draft_control": "per-request",
        "args": _sim_args(cfg),
        "profiles": [dict(p) for p in PROFILES.values()],
    }


def _knows_draft_control() -> bool:
    from proxy.config.settings import ModelSettings

    return "draft_control" in ModelSettings.model_fields


TOPOLOGIES: dict[str, Callable[[str, BenchConfig], dict[str, Any]]] = {
    "one-process": one_process_model,
    "pool": pool_model,
}


def proxy_config(policy: str, cfg: BenchConfig) -> dict[str, Any]:
    """The proxy's configuration for one policy run."""
    routing: dict[str, Any] = {"seed": cfg.seed, "clock_scale": cfg.time_scale, **cfg.routing}
    if policy == "rules":
        routing["learning"] = False
    if policy == NO_DETECTION:
        routing["change_detection"] = False
    return {
        "server": {
            "host": "127.0.0.1",
            "port": 0,
            "admin_key": ADMIN_KEY,
            "first_byte_timeout_s": 3600.0,
            "idle_timeout_s": 3600.0,
        },
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 1.0},
        "routing": routing,
        "models": [TOPOLOGIES[cfg.topology](policy, cfg)],
    }


def greedy_choices(rows: list[dict[str, Any]], topology: str) -> dict[str, tuple[str, Any]]:
    """profile -> (simulator URL, draft to evaluate) for the greedy pinner, from /admin rows."""
    if topology == "pool":
        return {str(r["profile"]): (str(r["url"]), None) for r in rows}
    url = str(rows[0]["url"])
    out: dict[str, tuple[str, Any]] = {}
    for name, depth in DEPTHS.items():
        draft: Any = "off" if depth == 0 else {"n_max": depth, "n_min": 0}
        out[name] = (url, draft)
    return out

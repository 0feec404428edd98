"""Test configurations for real proxy processes (see bench.processes for the processes)."""

from __future__ import annotations

from typing import Any

from bench.processes import ProxyProcess, free_port, running_proxy, start_proxy

__all__ = ["ADMIN_KEY", "ProxyProcess", "free_port", "running_proxy", "start_proxy"]

ADMIN_KEY = "test-admin-key"


def simulator_model(
    name: str = "mtp-demo",
    *,
    preset: str = "setup-b",
    time_scale: float = 20.0,
    slots: int = 4,
    extra_args: list[str] | None = None,
    profiles: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A model served by simulated backends off/min/max (time compressed for fast tests)."""
    args = ["--preset", preset, "--time-scale", str(time_scale), "-np", str(slots), "-c", "131072"]
    return {
        "name": name,
        "backend": "simulator",
        "args": args + (extra_args or []),
        "profiles": profiles
        or [
            {"name": "off"},
            {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
            {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
        ],
    }


def proxy_config(
    models: list[dict[str, Any]] | None = None,
    *,
    server: dict[str, Any] | None = None,
    supervisor: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN_KEY, **(server or {})},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0, "health_interval_s": 0.5, **(supervisor or {})},
        "routing": routing or {},
        "models": models or [simulator_model()],
    }

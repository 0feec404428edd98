"""Test configurations for real proxy processes (see bench.processes for the processes)."""

from __future__ import annotations

import time
from typing import Any

from bench.processes import ProxyProcess, free_port, running_proxy, start_proxy

__all__ = [
    "ADMIN_KEY",
    "ProxyProcess",
    "free_port",
    "running_proxy",
    "start_proxy",
    "wait_all_ready",
]

ADMIN_KEY = "test-admin-key"


def simulator_model(
    name: str = "mtp-demo",
    *,
    preset: str = "setup-b",
    time_scale: float = 20.0,
    slots: int = 4,
    extra_args: list[str] | None = None,
    profiles: list[dict[str, Any]] | None = None,
    draft_control: str = "per-process",
) -> dict[str, Any]:
    """A model served by simulated backends off/min/max (time compressed for fast tests): by
    default the three-process pool; draft_control "per-request" makes it one process."""
    args = ["--preset", preset, "--time-scale", str(time_scale), "-np", str(slots), "-c", "131072"]
    return {
        "name": name,
        "backend": "simulator",
        "draft_control": draft_control,
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


def wait_all_ready(proxy: ProxyProcess, ready: dict[str, int], timeout: float = 30.0) -> None:
    """Wait until /health counts `ready` backends per model (it is 200 from the first one on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.get_json("/health")[1].get("ready_backends") == ready:
            return
        time.sleep(0.05)
    raise TimeoutError(f"backends not all ready within {timeout}s: {proxy.get_json('/health')}")

"""Before tune starts a process of its own: is the served model already on that GPU?

A 27B model on one 24 GB GPU fits once. When the service is running (its configured address
answers /health like mtp-proxy) and serves the model on a GPU tune's process would use, a second
copy would not fit, or would share the GPU with the service and measure both at a fraction of
their speed: tune refuses, says why, and names the way that works (``--url``, through the
service), or stopping the service first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.config.settings import ModelSettings, Settings
from proxy.plans.plan import ModelPlan, plans_of
from proxy.plans.preflight import BackendNeed, FreeMemory, gib, model_needs
from proxy.tune.run.service import running_service
from supervisor.memory import query_free_gpu_bytes

Health = Callable[[str, int], dict[str, Any] | None]


def second_copy_refusal(
    settings: Settings,
    model: ModelSettings,
    *,
    health: Health = running_service,
    free_memory: FreeMemory = query_free_gpu_bytes,
) -> str | None:
    """Why tune must not start its own process for ``model`` now, or None when it may."""
    mine = _needs(model, ModelPlan(model.name, "pool", "tune"))[:1]  # tune runs one at a time
    if not mine:
        return None  # the simulator, a remote url, or the CPU: no GPU to share
    host, port = settings.server.host, settings.server.port
    answer = health(host, port)
    if answer is None:
        return None  # no service at the configured address: the box is tune's
    served = set(answer.get("ready_backends", {}))
    plans = plans_of(settings)
    occupied = [
        (other, need)
        for other in settings.models
        if other.name in served
        for need in _needs(other, plans[other.name])
        if _overlap(need, mine[0])
    ]
    if not occupied:
        return None
    names = sorted({other.name for other, _ in occupied})
    gpus = sorted({i for _, need in occupied for i in (need.devices or ())})
    where = f"GPU {', '.join(map(str, gpus))}" if gpus else "the GPU(s)"
    free = free_memory()
    room = "free GPU memory unknown" if free is None else f"{gib(sum(free))} free now"
    url = f"http://{host}:{port}"
    return (
        f"the service at {url} is running and serves {', '.join(names)} on {where}; tune's own "
        f"process would be a second copy of the weights there (~{gib(mine[0].bytes)}, "
        f"{room}). Measure through the service instead: mtp-proxy tune --url {url} "
        "--admin-key=KEY (no second copy, users are served meanwhile), or stop the service "
        "first (sudo systemctl stop mtp-proxy)"
    )


def _needs(model: ModelSettings, plan: ModelPlan) -> list[BackendNeed]:
    return model_needs(model, plan, [])


def _overlap(a: BackendNeed, b: BackendNeed) -> bool:
    """Two processes share a GPU unless both are pinned to different ones."""
    if a.devices is None or b.devices is None:
        return True
    return bool(set(a.devices) & set(b.devices))

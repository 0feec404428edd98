"""The running service, as tune sees it: what it runs, what else it is decoding, whether it runs.

``GET /admin/service`` (proxy.serving.admin) says what the service runs: its pid, config file and
learned file in force, the routing settings it classifies with, and each model's plan with the
draft flags of its processes. ``GET /admin/backends`` gives each backend's requests in flight:
sampled while a measured request runs, it tells what else was decoding beside it.

``running_service`` answers whether a service runs at a config's address, for the check before
tune starts a second copy of the weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.config.routing import RoutingSettings
from proxy.tune.plan.grid import DEFAULT_SPEC_TYPE, OFF, DraftSetting

_TIMEOUT = aiohttp.ClientTimeout(total=30)


class ServiceError(RuntimeError):
    """The service could not be read; the message says why in an operator's words."""


@dataclass(frozen=True)
class Route:
    """How a setting is served through the service: the profile pinned, the depth sent."""

    pin: str
    depth: int | None  # "speculative.n_max" in the body; None on a pool (the pin decides)


@dataclass(frozen=True)
class ServedModel:
    name: str
    backend: str  # simulator or llama-server
    context: int | None  # its -c
    shape: str  # one-process, pool, single
    decided: bool
    start_depth: int
    profiles: list[dict[str, Any]]
    processes: dict[str, dict[str, Any]]  # backend name -> its draft flags
    backends: list[str]
    single_profile: str | None = None
    draft_control: str | None = None  # what its backends' probe found ("ignored": stock)

    def spec_type(self) -> str:
        types = [p["spec_type"] for p in self.profiles if p.get("spec_type")]
        return types[0] if types else DEFAULT_SPEC_TYPE

    def routes(self, grid: list[DraftSetting]) -> tuple[dict[DraftSetting, Route], dict[str, str]]:
        """The settings of ``grid`` this service can serve, and why each other one cannot."""
        served: dict[DraftSetting, Route] = {}
        refused: dict[str, str] = {}
        for setting in grid:
            route, why = self._route(setting)
            if route is not None:
                served[setting] = route
            else:
                refused[setting.name] = why
        return served, refused

    def _route(self, setting: DraftSetting) -> tuple[Route | None, str]:
        if self.shape == "one-process":
            if self.draft_control in ("ignored", "none", "undecided") and not setting.is_off:
                return None, (
                    f"the service's process was not seen to honour the per-request depth (its "
                    f"probe says {self.draft_control!r}): a request may draft at its start-up "
                    "depth whatever it asks"
                )
            return self._depth_route(setting)
        if self.shape == "single":
            single = next((p for p in self.profiles if p["name"] == self.single_profile), None)
            if single is not None and _setting_of(single) == setting:
                return Route(single["name"], None), ""
            return None, f"the service runs {self.name} as one process at {self.single_profile}"
        for profile in self.profiles:  # a pool: each profile is a process of its own setting
            if _setting_of(profile) == setting:
                return Route(profile["name"], None), ""
        return None, (
            f"the service runs {self.name} as a {self.shape} of its profiles "
            f"({', '.join(p['name'] for p in self.profiles)}): only their settings are served"
        )

    def _depth_route(self, setting: DraftSetting) -> tuple[Route | None, str]:
        process = next(iter(self.processes.values()), {})
        depth = 0 if setting.is_off else (setting.n_max or 0)
        if not setting.is_off:
            if setting.spec_type != (process.get("spec_type") or setting.spec_type):
                return None, f"the running process drafts with {process.get('spec_type')}"
            if depth > self.start_depth:
                return None, (
                    f"n_max {depth} is deeper than the running process ({self.start_depth}): a "
                    "request can only lower the depth"
                )
            mine = (process.get("n_min"), process.get("p_min"))
            if (setting.n_min, setting.p_min) != mine:
                return None, (
                    f"needs n_min {_unset(setting.n_min)} / p_min {_unset(setting.p_min)}; the "
                    f"running process has n_min {_unset(mine[0])} / p_min {_unset(mine[1])} "
                    "(only n_max is per request)"
                )
        # The pin keeps the request out of the busy epochs' bookkeeping (routing.busy): the
        # profile of that depth where there is one, else the deepest (the body's depth rules).
        by_depth = sorted(self.profiles, key=lambda p: (p["depth"] != depth, -p["depth"]))
        return Route(by_depth[0]["name"], depth), ""


def _unset(value: object) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _setting_of(profile: Mapping[str, Any]) -> DraftSetting:
    if not profile.get("spec_type") or profile.get("spec_type") == "none":
        return OFF
    return DraftSetting(
        profile.get("n_max") or 3, profile.get("n_min"), profile.get("p_min"), profile["spec_type"]
    )


@dataclass(frozen=True)
class ServiceInfo:
    url: str
    pid: int
    config_path: str | None
    learned_file: str | None
    state: str
    state_loaded_at: float | None
    routing: RoutingSettings
    models: list[ServedModel] = field(default_factory=list)

    def model(self, name: str | None) -> ServedModel:
        if name is None:
            return self.models[0]
        for model in self.models:
            if model.name == name:
                return model
        known = ", ".join(m.name for m in self.models)
        raise ServiceError(f"the service serves no model {name!r} (models: {known})")


async def admin_get(
    session: aiohttp.ClientSession, url: str, path: str, admin_key: str | None
) -> Any:
    headers = {"X-Admin-Key": admin_key} if admin_key else {}
    try:
        async with session.get(url + path, headers=headers, timeout=_TIMEOUT) as resp:
            text = await resp.text()
            if resp.status == 404 and path.startswith("/admin"):
                raise ServiceError(
                    f"{url}{path} answered 404: admin endpoints are off (set server.admin_key) "
                    "or this is not mtp-proxy"
                )
            if resp.status == 401:
                raise ServiceError(f"{url}: the admin key is missing or wrong (--admin-key)")
            if resp.status != 200:
                raise ServiceError(f"{url}{path} answered {resp.status}: {text[:200]}")
            return json.loads(text)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ServiceError(f"cannot reach {url}: {exc!r}") from None
    except ValueError:
        raise ServiceError(f"{url}{path} did not answer JSON: is it mtp-proxy?") from None


async def read_service(
    session: aiohttp.ClientSession, url: str, admin_key: str | None
) -> ServiceInfo:
    data = await admin_get(session, url, "/admin/service", admin_key)
    rows = (await admin_get(session, url, "/admin/backends", admin_key)).get("backends", [])
    probed = {row.get("name"): row.get("draft_control") for row in rows if isinstance(row, dict)}
    try:
        models = [_served(row, probed) for row in data["models"]]
        return ServiceInfo(
            url=url,
            pid=int(data["pid"]),
            config_path=data.get("config_path"),
            learned_file=data.get("learned_file", data.get("state_file")),
            state=str(data.get("state", "")),
            state_loaded_at=data.get("state_loaded_at"),
            routing=RoutingSettings(**data["routing"]),
            models=models,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ServiceError(f"{url}/admin/service: not what tune expects ({exc!r})") from None


def _served(row: Mapping[str, Any], probed: Mapping[Any, Any]) -> ServedModel:
    plan = row.get("plan") or {}
    # The worst that a backend of it reported: anything but "per-request" before it.
    controls = sorted(
        {str(c) for b in row.get("backends", []) if (c := probed.get(b)) is not None},
        key=lambda control: (control == "per-request", control),
    )
    return ServedModel(
        name=row["name"],
        backend=row["backend"],
        context=row.get("context"),
        shape=plan.get("shape", "pool"),
        decided=bool(plan.get("decided", True)),
        start_depth=int(plan.get("start_depth", 0)),
        profiles=[dict(p) for p in row["profiles"]],
        processes={k: dict(v) for k, v in (plan.get("processes") or {}).items()},
        backends=list(row.get("backends", [])),
        single_profile=plan.get("single_profile"),
        draft_control=controls[0] if controls else None,
    )


class LoadSampler:
    """Samples a model's backends' requests in flight while one measured request runs: the mean
    of the others on the backend that served it (itself not counted)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        admin_key: str | None,
        interval_s: float,
    ) -> None:
        self._session, self._url, self._key = session, url, admin_key
        self._interval = interval_s
        self._samples: list[dict[str, int]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, backend: str | None) -> None:
        """The request is in flight (its answer began): sample from now on."""
        del backend  # every backend is sampled; the one that served is picked at the end
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def stop(self, backend: str | None) -> float | None:
        """Stop sampling; the mean of the other requests in flight on ``backend``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        counts = [s[backend] for s in self._samples if backend in s]
        if not counts:
            return 0.0
        return statistics.fmean(max(n - 1, 0) for n in counts)

    async def _sample(self) -> None:
        while True:
            try:
                data = await admin_get(self._session, self._url, "/admin/backends", self._key)
                self._samples.append(
                    {row["name"]: int(row["in_flight"]) for row in data["backends"]}
                )
            except (ServiceError, KeyError, TypeError, ValueError):
                pass  # a lost sample: the others still tell
            await asyncio.sleep(self._interval)


def running_service(host: str, port: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The /health answer of an mtp-proxy at host:port (200 or 503 while it starts), or None
    when nothing (or something else) answers there. Blocking."""
    address = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # noqa: S104 (a listen-all)
    if ":" in address:
        address = f"[{address}]"
    url = f"http://{address}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (OSError, ValueError):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("ready_backends"), dict):
        return data
    return None

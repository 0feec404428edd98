"""A run through the running service (``--url``): its context read through the proxy, a warm-up
through it, then ``proxy.tune.run.service_run`` measures; and, after ``--apply``, the reload watched
until the service serves the applied profiles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from proxy.routing.telemetry import Observation
from proxy.tune.measure.reading import measure
from proxy.tune.plan.context import ContextError, read_context
from proxy.tune.plan.estimate import Speeds, WarmUpError, priors, warm_up, warm_up_items
from proxy.tune.plan.grid import OFF, DraftSetting
from proxy.tune.plan.workload import WorkItem
from proxy.tune.run.job import Job, JobError
from proxy.tune.run.service import Route, ServedModel, ServiceError, ServiceInfo, read_service
from proxy.tune.run.service_run import ServiceRun

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=3600)


@dataclass
class ThroughService:
    job: Job
    info: ServiceInfo
    served: ServedModel
    routes: dict[DraftSetting, Route]
    admin_key: str | None
    headers: Mapping[str, str]  # the client key, if any

    async def measure(self) -> None:
        job, url = self.job, self.info.url
        async with aiohttp.ClientSession(timeout=_TIMEOUT, trust_env=False) as session:
            try:
                server = await read_context(
                    session, url, model=self.served.name, headers=self.headers
                )
            except ContextError as exc:
                raise JobError(f"through {url}: {exc}") from None
            job.open_store(job.build_workload(server), server)
            if job.speeds is None:
                try:
                    speeds = await self._warm_up(session)
                    source = "measured by a warm-up through the service"
                except WarmUpError as exc:
                    speeds, source = priors(job.routing), f"{exc}; [routing] priors"
                job.save_speeds(speeds)
            else:
                speeds, source = job.speeds, "the previous run's warm-up"
        processes = (
            f"none started: the service's {self.served.shape} "
            f"({', '.join(self.served.backends)}) serves them, users' requests beside them"
        )
        recorder = job.start_recorder(speeds, 0, source, processes, f"the service at {url}")
        run = ServiceRun(
            url=url,
            admin_key=self.admin_key,
            headers=self.headers,
            pin_header=self.info.routing.pin_header,
            routes={s: r for s, r in self.routes.items() if s in job.grid},
            recorder=recorder,
            clock_scale=job.clock_scale,
        )
        await run.run()

    async def _warm_up(self, session: aiohttp.ClientSession) -> Speeds:
        job = self.job
        route = self.routes.get(OFF) or min(self.routes.values(), key=lambda r: r.depth or 0)
        headers = {**self.headers, self.info.routing.pin_header: route.pin}
        assert job.server is not None

        async def send(item: WorkItem, tag: str) -> Observation:
            answer = await measure(
                session, self.info.url, item.path, item.request(tag),
                clock_scale=job.clock_scale, depth=route.depth, headers=headers,
            )  # fmt: skip
            return answer.observation

        ratio = job.server.chars_per_token.get("prose", 3.9)
        return await warm_up(send, warm_up_items(job.server.n_ctx, ratio, job.model))


async def await_reload(
    url: str,
    admin_key: str | None,
    model: str,
    profiles: list[str],
    timeout_s: float,
    *,
    state_after: float | None = None,
) -> tuple[str, bool]:
    """Wait until the service serves ``profiles`` for ``model`` on a ready backend (and, with
    ``state_after``, loaded its learned file since that time); what it says then (its learned
    file's load report) and True, or why it did not within the time and False."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession(trust_env=False) as session:
        while time.monotonic() < deadline:
            try:
                info = await read_service(session, url, admin_key)
                served = info.model(model)
                names = [p["name"] for p in served.profiles]
                health = await _health(session, url)
                loaded = state_after is None or (info.state_loaded_at or 0.0) >= state_after
                if names == profiles and health.get(model, 0) > 0 and loaded:
                    served_now = f"the service serves {', '.join(names)}"
                    return f"{served_now}; learned state: {info.state}", True
                last = f"profiles {', '.join(names)}, ready backends {health.get(model, 0)}"
            except ServiceError as exc:
                last = str(exc)
            await asyncio.sleep(0.2)
    return f"the reload was not seen within {timeout_s:.0f}s ({last})", False


async def _health(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    try:
        async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
            data = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}
    ready = data.get("ready_backends") if isinstance(data, dict) else None
    return {str(k): int(v) for k, v in ready.items()} if isinstance(ready, dict) else {}

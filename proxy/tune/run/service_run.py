"""Replays the workload through the running service: one copy of the weights, nothing stopped.

Each request goes to the proxy like any client's, pinned to a profile (``X-MTP-Profile``) and,
on a model served by one process, carrying its own depth (``"speculative.n_max"``, which the
proxy keeps): the setting is the request's, the process is the service's. Settings the service
cannot serve so (another n_min or p_min than its process, a depth above its start-up depth, a
setting that is no profile of a pool) are listed as not measurable this way
(``ServedModel.routes``).

Users' requests are served as usual meanwhile. Each measured request samples the service's
requests in flight while it runs (``LoadSampler``): a request that decoded beside others is
kept with that load, and the analysis puts it in the cell of its load level.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp

from proxy.tune.measure.reading import Answer, measure
from proxy.tune.measure.record import Recorder
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.plan.workload import WorkItem
from proxy.tune.run.own_run import REQUEST_TIMEOUT
from proxy.tune.run.service import LoadSampler, Route

MODE = "service"
_SAMPLE_S = 0.25  # wall seconds between two samples of the requests in flight


@dataclass
class ServiceRun:
    url: str
    admin_key: str | None
    headers: Mapping[str, str]  # the client key, if the service wants one
    pin_header: str
    routes: dict[DraftSetting, Route]
    recorder: Recorder
    clock_scale: float = 1.0

    async def run(self) -> None:
        settings = list(self.routes)
        recorder = self.recorder
        names = ", ".join(s.name for s in settings)
        recorder.progress.begin(f"through {self.url}: {names}")
        async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT, trust_env=False) as session:
            for repeat in range(1, recorder.repeats + 1):
                for item in recorder.workload.items:
                    for setting in settings:
                        if recorder.store.has(setting.name, item.id, repeat):
                            continue
                        # One process, one prefix cache: each setting's prompt differs.
                        tag = f"tune {item.id}.{repeat} {setting.name}"
                        send = self.sender(session, setting, item, tag)
                        await recorder.request(setting, item, repeat, tag, MODE, send)

    def sender(
        self, session: aiohttp.ClientSession, setting: DraftSetting, item: WorkItem, tag: str
    ) -> Callable[[], Awaitable[tuple[Answer, float | None]]]:
        route = self.routes[setting]
        headers = {**self.headers, self.pin_header: route.pin}

        async def send() -> tuple[Answer, float | None]:
            sampler = LoadSampler(session, self.url, self.admin_key, _SAMPLE_S)
            answer: Answer | None = None
            try:
                answer = await measure(
                    session,
                    self.url,
                    item.path,
                    item.request(tag),
                    clock_scale=self.clock_scale,
                    depth=route.depth,
                    headers=headers,
                    started=sampler.start,
                )
            finally:
                others = await sampler.stop(None if answer is None else answer.backend)
            return answer, others

        return send

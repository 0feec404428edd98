"""A run on tune's own backend processes: for a box whose service is stopped.

The first process started reads the server's context (``proxy.tune.plan.context``) unless an earlier
run in OUT already did, sizes the workload to it, checks OUT, and warms up for the estimate;
then the runner (``proxy.tune.run.own_run``) measures, one process at a time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import aiohttp

from proxy.config.settings import ModelSettings, Settings
from proxy.routing.telemetry import Observation
from proxy.tune.measure.reading import measure
from proxy.tune.measure.record import Recorder
from proxy.tune.plan.context import ContextError, read_context
from proxy.tune.plan.estimate import Speeds, WarmUpError, priors, warm_up, warm_up_items
from proxy.tune.plan.workload import WorkItem
from proxy.tune.run.job import Job
from proxy.tune.run.own_run import TuneRun, plan_groups
from supervisor.child import Child

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=3600)


@dataclass
class OwnProcesses:
    job: Job
    settings: Settings
    model: ModelSettings
    runner: TuneRun

    def processes(self) -> tuple[int, str]:
        """Backend starts of the plan, and the plan's words for them."""
        job = self.job
        pending = [s for s in job.grid if job.workload is None or job.pending_of(s)]
        mode = self.runner.mode
        groups = len(plan_groups(pending, per_request=mode != "per-process"))
        if mode == "per-process":
            return len(pending), f"{len(pending)} backend starts, one per setting, one at a time"
        shared = (
            f"{groups} backend start(s), one at a time: settings that differ only in n_max share "
            "one process and each request carries its depth"
        )
        if mode == "auto":
            shared += f" (if the backend honours the per-request depth; else up to {len(pending)})"
        return groups, shared

    async def measure(self) -> None:
        job = self.job
        server, speeds = job.previous()
        if server is not None:
            job.open_store(job.build_workload(server), server)
            job.speeds = speeds
        else:
            job.store.check({"model": job.model, "via": job.via})
            self._say_preliminary()
        if job.workload is not None and job.speeds is not None:
            self._recorder(job.speeds, "the previous run's warm-up", first_done=False)
            await self.runner.run(job.grid)
        else:
            await self.runner.run(job.grid, self._prepare)

    def _say_preliminary(self) -> None:
        _, words = self.processes()
        grid = ", ".join(s.label for s in self.job.grid)
        ctx = self.job.configured_ctx
        _say(
            f"tune {self.job.model}, measured on tune's own processes: {len(self.job.grid)} "
            f"settings ({grid}), {self.job.repeats} repeats; {words}. Starting the first backend "
            "to read its context"
            + (f" (the config says -c {ctx:,})" if ctx else "")
            + " and measure its speed; the plan follows."
        )

    async def _prepare(self, child: Child, took: float) -> Recorder | None:
        job = self.job
        base_url = child.base_url
        assert base_url is not None
        # A new connection per request: llama-server closes one after an early error answer.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=_TIMEOUT, trust_env=False
        ) as session:
            if job.workload is None:
                try:
                    server = await read_context(session, base_url)
                except ContextError as exc:
                    job.hints.append(f"{exc}: the prompts are sized from the config's -c")
                    server = None
                job.open_store(job.build_workload(server), server)
            per_request = getattr(child, "draft_control", None) == "per-request"
            depth = 0 if per_request else None
            n_ctx = job.server.n_ctx if job.server else (job.configured_ctx or 4096)
            ratio = (job.server.chars_per_token if job.server else {}).get("prose", 3.9)

            async def send(item: WorkItem, tag: str) -> Observation:
                answer = await measure(
                    session, base_url, item.path, item.request(tag),
                    clock_scale=job.clock_scale, depth=depth,
                )  # fmt: skip
                return answer.observation

            if job.speeds is None:
                try:
                    speeds = await warm_up(send, warm_up_items(n_ctx, ratio, job.model), took)
                    source = "measured by a warm-up on the first backend"
                except WarmUpError as exc:
                    speeds, source = priors(job.routing, took), f"{exc}; [routing] priors"
            else:
                speeds, source = replace(job.speeds, start_s=took), "the previous run's warm-up"
        job.save_speeds(speeds)
        return self._recorder(speeds, source, first_done=True)

    def _recorder(self, speeds: Speeds, source: str, *, first_done: bool) -> Recorder:
        starts, words = self.processes()
        if first_done:
            starts = max(starts - 1, 0)
        recorder = self.job.start_recorder(speeds, starts, source, words, "tune's own processes")
        self.runner.recorder = recorder
        return recorder


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

"""Replays the workload under each draft setting on tune's own backend processes, one at a time.

For a box whose service is stopped (through a running service: ``proxy.tune.run.service_run``).

Per process (stock llama-server): each setting is its own process, started after the previous
one stopped, so never more than one copy of the weights is in memory. Per request (a backend
that honours ``"speculative.n_max"``): settings that differ only in n_max share one process
started at the deepest of them, and each request carries its depth (0 = off); the requests of
one prompt are sent side by side, setting after setting. Settings that differ in n_min or
p_min still need their own process (the per-request field is n_max only).

In ``auto`` mode the draft-control probe of the supervisor decides (``Backend.draft_control``,
supervisor.draft_probe): the first process of a group is started anyway; when it does not honour
the field, the group's other settings get processes of their own.

The first process started also serves the run's preparation (``prepare``): its context and
tokenizer size the workload, and a warm-up measures its speed for the estimate.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from proxy.config.settings import ModelSettings
from proxy.tune.measure.reading import Answer, measure
from proxy.tune.measure.record import Recorder
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.run.launch import LaunchError, running
from supervisor.child import Child
from supervisor.settings import SupervisorSettings

Mode = Literal["auto", "per-process", "per-request"]
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=3600)
Prepare = Callable[[Child, float], Awaitable[Recorder | None]]
"""Called once the first process is ready (with the seconds its start took): returns the
recorder of the run (workload sized, store checked), or None to stop before measuring."""


@dataclass
class Group:
    """Settings one process can serve: started at ``launch``, the deepest of them."""

    launch: DraftSetting
    settings: list[DraftSetting] = field(default_factory=list)


@dataclass
class TuneRun:
    model: ModelSettings
    supervisor: SupervisorSettings
    mode: Mode = "auto"
    clock_scale: float = 1.0
    recorder: Recorder | None = None
    launch_failures: list[str] = field(default_factory=list)
    _grid: list[DraftSetting] = field(default_factory=list, init=False)
    _later: list[Group] | None = field(default=None, init=False)

    async def run(self, grid: Sequence[DraftSetting], prepare: Prepare | None = None) -> None:
        """Measure ``grid``; ``prepare`` runs on the first process before anything is measured
        (without it, ``recorder`` must be set)."""
        self._grid, self._later = list(grid), None
        queue = self._queue()
        # A new connection per request: llama-server closes one after an early error answer
        # (a prompt over the context), and a kept-alive one would fail the next request.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=REQUEST_TIMEOUT, trust_env=False
        ) as session:
            while queue:
                group = queue.pop(0)
                rest = await self._group(session, group, prepare)
                if self.recorder is None:
                    return  # the preparation stopped the run
                if self._later is not None:  # prepared: the plan of what is still to measure
                    queue, self._later, prepare = self._later, None, None
                queue[0:0] = [Group(s, [s]) for s in rest]

    def _queue(self) -> list[Group]:
        todo = [s for s in self._grid if self.pending(s)]
        return plan_groups(todo, per_request=self.mode != "per-process")

    def pending(self, setting: DraftSetting) -> bool:
        return self.recorder is None or bool(self.recorder.pending(setting))

    async def _group(
        self, session: aiohttp.ClientSession, group: Group, prepare: Prepare | None
    ) -> list[DraftSetting]:
        """Start the group's process, measure what it can; the settings needing their own."""
        if self.recorder is not None:
            self.recorder.progress.begin(f"starting {group.launch.label}")
        else:
            print(f"tune: starting {group.launch.label}", file=sys.stderr, flush=True)
        began = time.monotonic()
        try:
            async with running(self.model, group.launch, self.supervisor, session) as child:
                took = time.monotonic() - began
                if prepare is not None:
                    self.recorder = await prepare(child, took)
                    if self.recorder is None:
                        return []
                    # Once, before measuring: failed requests stay pending, and are not retried
                    # on a process of their own later in the run.
                    here = set(group.settings)
                    self._later = [g for g in self._queue() if not set(g.settings) <= here]
                else:
                    assert self.recorder is not None
                    self.recorder.progress.started(took)
                return await self._measure_group(session, child, group)
        except LaunchError as exc:
            self.launch_failures.append(str(exc))
            if self.recorder is not None:
                self.recorder.progress.note(f"tune: skipped: {exc}")
            return [s for s in group.settings if s != group.launch]

    async def _measure_group(
        self, session: aiohttp.ClientSession, child: Child, group: Group
    ) -> list[DraftSetting]:
        """Measure what this process can; returns the settings that need their own."""
        control = getattr(child, "draft_control", None)  # the supervisor's probe, if it has one
        per_request = self.mode == "per-request" or (
            self.mode == "auto" and control == "per-request"
        )
        todo = [s for s in group.settings if self.pending(s)]
        if per_request and len(group.settings) > 1:
            await self._interleaved(session, child, todo)
            return []
        if group.launch in todo:
            await self._one_setting(session, child, group.launch)
        return [s for s in todo if s != group.launch]

    async def _one_setting(
        self, session: aiohttp.ClientSession, child: Child, setting: DraftSetting
    ) -> None:
        recorder = self.recorder
        assert recorder is not None
        recorder.progress.begin(setting.label)
        for repeat, item in recorder.pending(setting):
            # The same tag for every setting: a paired comparison (same prompt, same answer).
            tag = f"tune {item.id}.{repeat}"
            send = self._sender(session, child, item.path, item.request(tag), None)
            await recorder.request(setting, item, repeat, tag, "per-process", send)

    async def _interleaved(
        self, session: aiohttp.ClientSession, child: Child, settings: list[DraftSetting]
    ) -> None:
        recorder = self.recorder
        assert recorder is not None
        names = ", ".join(s.name for s in settings)
        recorder.progress.begin(f"per request: {names}")
        for repeat in range(1, recorder.repeats + 1):
            for item in recorder.workload.items:
                for s in settings:
                    if recorder.store.has(s.name, item.id, repeat):
                        continue
                    # One process keeps its prefix cache: each setting's prompt differs.
                    tag = f"tune {item.id}.{repeat} {s.name}"
                    send = self._sender(session, child, item.path, item.request(tag), s.n_max or 0)
                    await recorder.request(s, item, repeat, tag, "per-request", send)

    def _sender(
        self,
        session: aiohttp.ClientSession,
        child: Child,
        path: str,
        body: dict[str, object],
        depth: int | None,
    ) -> Callable[[], Awaitable[tuple[Answer, float | None]]]:
        base_url = child.base_url
        assert base_url is not None  # READY backends have a port

        async def send() -> tuple[Answer, float | None]:
            answer = await measure(
                session, base_url, path, body, clock_scale=self.clock_scale, depth=depth
            )
            return answer, None

        return send


def plan_groups(settings: Sequence[DraftSetting], *, per_request: bool) -> list[Group]:
    """Per process: one group per setting. Per request: settings with equal n_min, p_min and
    spec type share a group started at their deepest n_max; off joins the group of plain
    settings (n_min and p_min unset), else the first group."""
    if not per_request:
        return [Group(s, [s]) for s in settings]
    groups: dict[object, Group] = {}
    off = [s for s in settings if s.is_off]
    for s in settings:
        key = s.process_key()
        if key is None:
            continue
        group = groups.setdefault(key, Group(s))
        group.settings.append(s)
        if (s.n_max or 0) > (group.launch.n_max or 0):
            group.launch = s
    ordered = list(groups.values())
    if off:
        plain = [g for g in ordered if g.launch.n_min is None and g.launch.p_min is None]
        target = plain[0] if plain else ordered[0] if ordered else None
        if target is None:
            ordered.append(Group(off[0], list(off)))
        else:
            target.settings[0:0] = off
    return ordered

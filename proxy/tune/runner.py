"""Replays the workload under each draft setting, one backend process at a time.

Per process (stock llama-server): each setting is its own process, started after the previous
one stopped, so never more than one copy of the weights is in memory. Per request (a backend
that honours ``"speculative.n_max"``): settings that differ only in n_max share one process
started at the deepest of them, and each request carries its depth (0 = off); the requests of
one prompt are sent side by side, setting after setting. Settings that differ in n_min or
p_min still need their own process (the per-request field is n_max only).

In ``auto`` mode the draft-control probe of the supervisor decides (``Backend.draft_control``,
supervisor.draft_probe): the first process of a group is started anyway; when it does not honour the
field, the group's other settings get processes of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from proxy.config.settings import ModelSettings
from proxy.tune.grid import DraftSetting
from proxy.tune.launch import LaunchError, running
from proxy.tune.measure import MeasureError, Measurement, measure
from proxy.tune.progress import Progress
from proxy.tune.store import ResultStore
from proxy.tune.workload import WorkItem, Workload
from supervisor.child import Child
from supervisor.settings import SupervisorSettings

Mode = Literal["auto", "per-process", "per-request"]
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=3600)


@dataclass
class Group:
    """Settings one process can serve: started at ``launch``, the deepest of them."""

    launch: DraftSetting
    settings: list[DraftSetting] = field(default_factory=list)


@dataclass
class TuneRun:
    model: ModelSettings
    supervisor: SupervisorSettings
    workload: Workload
    repeats: int
    store: ResultStore
    progress: Progress
    mode: Mode = "auto"
    clock_scale: float = 1.0
    modes_used: dict[str, str] = field(default_factory=dict)  # setting name -> mode
    failures: list[str] = field(default_factory=list)

    def pending(self, setting: DraftSetting) -> list[tuple[int, WorkItem]]:
        """(repeat, item) pairs of a setting not measured yet, repeat by repeat."""
        return [
            (repeat, item)
            for repeat in range(1, self.repeats + 1)
            for item in self.workload.items
            if not self.store.has(setting.name, item.id, repeat)
        ]

    async def run(self, grid: Sequence[DraftSetting]) -> None:
        todo = [s for s in grid if self.pending(s)]
        queue = plan_groups(todo, per_request=self.mode != "per-process")
        # A new connection per request: llama-server closes one after an early error answer
        # (a prompt over the context), and a kept-alive one would fail the next request.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(
            connector=connector, timeout=_REQUEST_TIMEOUT, trust_env=False
        ) as session:
            while queue:
                group = queue.pop(0)
                self.progress.begin(f"starting {group.launch.label}")
                try:
                    async with running(self.model, group.launch, self.supervisor, session) as child:
                        rest = await self._measure_group(session, child, group)
                except LaunchError as exc:
                    self.failures.append(str(exc))
                    self.progress.note(f"tune: skipped: {exc}")
                    rest = [s for s in group.settings if s != group.launch]
                queue[0:0] = [Group(s, [s]) for s in rest]

    async def _measure_group(
        self, session: aiohttp.ClientSession, child: Child, group: Group
    ) -> list[DraftSetting]:
        """Measure what this process can; returns the settings that need their own."""
        control = getattr(child, "draft_control", None)  # the supervisor's probe, if it has one
        per_request = self.mode == "per-request" or (
            self.mode == "auto" and control == "per-request"
        )
        if per_request and len(group.settings) > 1:
            await self._interleaved(session, child, group.settings)
            return []
        await self._one_setting(session, child, group.launch)
        return [s for s in group.settings if s != group.launch]

    async def _one_setting(
        self, session: aiohttp.ClientSession, child: Child, setting: DraftSetting
    ) -> None:
        self.modes_used[setting.name] = "per-process"
        self.progress.begin(setting.label)
        for repeat, item in self.pending(setting):
            # The same tag for every setting: a paired comparison (same prompt, same answer).
            await self._request(session, child, setting, item, repeat, f"tune {item.id}.{repeat}")

    async def _interleaved(
        self, session: aiohttp.ClientSession, child: Child, settings: list[DraftSetting]
    ) -> None:
        for s in settings:
            self.modes_used[s.name] = "per-request"
        names = ", ".join(s.name for s in settings)
        self.progress.begin(f"per request: {names}")
        for repeat in range(1, self.repeats + 1):
            for item in self.workload.items:
                for s in settings:
                    if self.store.has(s.name, item.id, repeat):
                        continue
                    # One process keeps its prefix cache: each setting's prompt differs.
                    tag = f"tune {item.id}.{repeat} {s.name}"
                    await self._request(session, child, s, item, repeat, tag, per_request=True)

    async def _request(
        self,
        session: aiohttp.ClientSession,
        child: Child,
        setting: DraftSetting,
        item: WorkItem,
        repeat: int,
        tag: str,
        *,
        per_request: bool = False,
    ) -> None:
        base_url = child.base_url
        assert base_url is not None  # READY backends have a port
        depth = (setting.n_max or 0) if per_request else None
        try:
            obs = await measure(
                session,
                base_url,
                item.path,
                item.request(tag),
                clock_scale=self.clock_scale,
                depth=depth,
            )
        except (TimeoutError, MeasureError, aiohttp.ClientError) as exc:
            self.failures.append(f"{setting.name} {item.id} r{repeat}: {exc}")
            self.progress.note(f"tune: {setting.name} {item.id} repeat {repeat} failed: {exc}")
            self.progress.tick("failed")
            return
        mode = "per-request" if per_request else "per-process"
        m = Measurement.of(
            obs, setting=setting.name, item=item.id, repeat=repeat, tag=tag, mode=mode
        )
        self.store.add(m)
        speed = f"{m.decode_tok_s:.1f} tok/s" if m.decode_tok_s else "no decode speed"
        self.progress.tick(f"{item.id} r{repeat}: {speed}")


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

"""One request of the plan, from sending to the store: measured, failed, or given up.

Both ways of measuring (tune's own processes, ``proxy.tune.run.own_run``; the running service,
``proxy.tune.run.service_run``) send their requests through ``Recorder.request``: a measured
answer is saved at once (a rerun resumes from it), a failure is counted by class and reason
(``proxy.tune.measure.failures``), and a request of a class that has failed throughout its first
repeat is not sent at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from proxy.tune.measure.failures import CONNECTION, TIMEOUT, Failures, reason_of
from proxy.tune.measure.reading import Answer, MeasureError, Measurement
from proxy.tune.measure.store import ResultStore
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.plan.workload import WorkItem, Workload
from proxy.tune.run.progress import Progress

Send = Callable[[], Awaitable[tuple[Answer, float | None]]]
"""Sends the request; its answer and the other requests that decoded beside it (None: none
could, tune's own process)."""


@dataclass
class Recorder:
    store: ResultStore
    workload: Workload
    repeats: int
    progress: Progress
    failures: Failures = field(default_factory=Failures)
    planned_s: dict[str, float] = field(default_factory=dict)
    """Item id -> its planned wall seconds (proxy.tune.plan.estimate)."""
    modes_used: dict[str, str] = field(default_factory=dict)  # setting name -> mode

    def pending(self, setting: DraftSetting) -> list[tuple[int, WorkItem]]:
        """(repeat, item) pairs of a setting not measured yet, repeat by repeat."""
        return [
            (repeat, item)
            for repeat in range(1, self.repeats + 1)
            for item in self.workload.items
            if not self.store.has(setting.name, item.id, repeat)
        ]

    def label(self, item: WorkItem) -> str:
        return self.workload.classes.get(item.id, "?")

    async def request(
        self,
        setting: DraftSetting,
        item: WorkItem,
        repeat: int,
        tag: str,
        mode: str,
        send: Send,
    ) -> None:
        label = self.label(item)
        planned = self.planned_s.get(item.id, 0.0)
        if self.failures.given_up(label, repeat):
            self.failures.skip(label)
            self.progress.skip(planned)
            return
        self.failures.attempt(label, repeat)
        self.modes_used.setdefault(setting.name, mode)
        try:
            answer, others = await send()
        except MeasureError as exc:
            self._failed(setting, item, repeat, reason_of(exc.status, exc.detail), str(exc))
            self.progress.tick("failed", planned)
            return
        except TimeoutError as exc:
            self._failed(setting, item, repeat, TIMEOUT, repr(exc))
            self.progress.tick("failed", planned)
            return
        except aiohttp.ClientError as exc:
            self._failed(setting, item, repeat, CONNECTION, repr(exc))
            self.progress.tick("failed", planned)
            return
        self.failures.answered(label)
        m = Measurement.of(
            answer.observation,
            setting=setting.name,
            item=item.id,
            repeat=repeat,
            tag=tag,
            mode=mode,
            others=others,
            backend=answer.backend,
        )
        self.store.add(m)
        speed = f"{m.decode_tok_s:.1f} tok/s" if m.decode_tok_s else "no decode speed"
        beside = f", {others:.1f} others decoding" if others else ""
        self.progress.tick(f"{item.id} r{repeat}: {speed}{beside}", planned)

    def _failed(
        self, setting: DraftSetting, item: WorkItem, repeat: int, reason: str, text: str
    ) -> None:
        label = self.label(item)
        if self.failures.add(label, reason, f"{setting.name} {item.id} r{repeat}: {text}"):
            self.progress.note(
                f"tune: {label} ({item.id}, {setting.name}): {reason}; further failures of "
                "this class and reason are counted in the summary"
            )

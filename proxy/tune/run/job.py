"""A tune run's shared steps, whichever way it measures (``own_job``, ``service_job``): the
workload sized to the server, the store checked, the plan printed, the recorder and its
estimate.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.config.routing import RoutingSettings
from proxy.tune.measure.record import Recorder
from proxy.tune.measure.store import ResultStore
from proxy.tune.plan.context import ServerContext
from proxy.tune.plan.estimate import Speeds, wall_s
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.plan.outline import Plan
from proxy.tune.plan.workload import (
    Workload,
    builtin_workload,
    file_workload,
    fit_workload,
    size_of,
)
from proxy.tune.run.progress import Progress

DEFAULT_CTX = 4096  # neither -c nor the server says: the built-in workload's sizing only


class JobError(RuntimeError):
    """The run cannot go on; the message says why (exit 2)."""


@dataclass
class Job:
    args: argparse.Namespace
    model: str
    routing: RoutingSettings
    grid: list[DraftSetting]  # the settings this run measures
    store: ResultStore
    repeats: int
    clock_scale: float
    via: str  # "processes" or "service" (results of the two are not mixed in one OUT)
    configured_ctx: int | None  # the model's -c
    unmeasurable: dict[str, str] = field(default_factory=dict)
    hints: list[str] = field(default_factory=list)
    recorder: Recorder | None = None
    workload: Workload | None = None
    server: ServerContext | None = None
    speeds: Speeds | None = None

    # --- the workload and the store ------------------------------------------------------

    def build_workload(self, server: ServerContext | None) -> Workload:
        spec = self.args.workload
        if spec == "builtin":
            n_ctx = self.configured_ctx or (server.n_ctx if server else DEFAULT_CTX)
            buckets = self.routing.context_buckets
            workload = builtin_workload(n_ctx, buckets, self.model, server=server)
        else:
            workload = file_workload(Path(spec), self.model)
        return fit_workload(workload, self.routing, server)

    def previous(self) -> tuple[ServerContext | None, Speeds | None]:
        """The server's context and the warm-up of an earlier run of the same model and
        context in OUT: a rerun reuses them, and prints its whole plan at once."""
        old = self.store.previous()
        if not old or old.get("model") != self.model or old.get("via") != self.via:
            return None, None
        if old.get("configured_ctx") != self.configured_ctx:
            return None, None
        try:
            server = ServerContext.from_json(old["server"]) if old.get("server") else None
            speeds = Speeds.from_json(old["speeds"]) if old.get("speeds") else None
        except (KeyError, TypeError, ValueError):
            return None, None
        return server, speeds

    def open_store(self, workload: Workload, server: ServerContext | None) -> None:
        meta: dict[str, Any] = {
            "model": self.model,
            "workload": workload.fingerprint(),
            "via": self.via,
            "configured_ctx": self.configured_ctx,
            "server": None if server is None else server.to_json(),
            "speeds": None if self.speeds is None else self.speeds.to_json(),
        }
        self.store.open(meta)  # StoreError: another run's results
        self.workload, self.server = workload, server

    def save_speeds(self, speeds: Speeds) -> None:
        self.speeds = speeds
        assert self.workload is not None
        self.store.open(
            {
                "model": self.model,
                "workload": self.workload.fingerprint(),
                "via": self.via,
                "configured_ctx": self.configured_ctx,
                "server": None if self.server is None else self.server.to_json(),
                "speeds": speeds.to_json(),
            }
        )

    # --- the plan and the recorder ---------------------------------------------------------

    def plan(self, processes: str, via_words: str) -> Plan:
        assert self.workload is not None
        pending = sum(len(self.pending_of(s)) for s in self.grid)
        context = ""
        if self.server is not None:
            asked = f" (the config says -c {self.configured_ctx:,})" if self.configured_ctx else ""
            context = f"{self.server.n_ctx:,} tokens per slot, from the server's /props{asked}"
        return Plan(
            model=self.model,
            via=via_words,
            settings=self.grid,
            workload=self.workload,
            repeats=self.repeats,
            pending=pending,
            processes=processes,
            unmeasurable=self.unmeasurable,
            context=context,
            clock_scale=self.clock_scale,
            hints=self.hints,
        )

    def pending_of(self, setting: DraftSetting) -> list[tuple[int, str]]:
        assert self.workload is not None
        return [
            (r, item.id)
            for r in range(1, self.repeats + 1)
            for item in self.workload.items
            if not self.store.has(setting.name, item.id, r)
        ]

    def planned_model_s(self, speeds: Speeds) -> dict[str, float]:
        """Item id -> its seconds at the backend's own speed (a simulator's modelled time)."""
        assert self.workload is not None
        ratios = self.server.chars_per_token if self.server else {}
        out = {}
        for item in self.workload.items:
            size = size_of(item, ratios)
            out[item.id] = speeds.request_s(size.prompt_tokens, size.output_tokens)
        return out

    def start_recorder(
        self, speeds: Speeds, starts: int, source: str, processes: str, via: str
    ) -> Recorder:
        """Print the plan and its estimate; the recorder that measures it."""
        assert self.workload is not None
        plan = self.plan(processes, via)
        model_s = self.planned_model_s(speeds)
        pending = [item for s in self.grid for _, item in self.pending_of(s)]
        total_model_s = sum(model_s[i] for i in pending)
        _say("\n".join(plan.lines()))
        _say(plan.estimate_line(total_model_s, starts, speeds, source))
        planned = {i: wall_s(s, self.clock_scale) for i, s in model_s.items()}
        progress = Progress(
            len(pending),
            sum(planned[i] for i in pending),
            starts=starts,
            start_s=speeds.start_s,
        )
        self.recorder = Recorder(
            store=self.store,
            workload=self.workload,
            repeats=self.repeats,
            progress=progress,
            planned_s=planned,
        )
        return self.recorder


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

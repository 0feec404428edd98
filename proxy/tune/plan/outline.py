"""The plan of a run, printed before anything is measured: requests, settings, classes,
processes, what is left out and why, and the time it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.tune.plan.estimate import Speeds, wall_s
from proxy.tune.plan.grid import DraftSetting
from proxy.tune.plan.workload import Workload
from proxy.tune.report.labels import class_words
from proxy.tune.run.progress import format_duration


@dataclass
class Plan:
    model: str
    via: str  # "own processes" or "the service at URL"
    settings: list[DraftSetting]
    workload: Workload
    repeats: int
    pending: int  # requests still to measure
    processes: str  # what runs them, in words
    unmeasurable: dict[str, str] = field(default_factory=dict)
    context: str = ""  # the server's context, in words
    clock_scale: float = 1.0
    hints: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.settings) * len(self.workload.items) * self.repeats

    def lines(self) -> list[str]:
        names = ", ".join(s.label for s in self.settings)
        classes = self.workload.planned_classes()
        out = [
            f"tune {self.model}, measured on {self.via}:",
            f"  settings ({len(self.settings)}): {names}",
            f"  classes ({len(classes)}): {'; '.join(class_words(c) for c in classes)}",
            f"  requests: {len(self.settings)} settings x {len(self.workload.items)} prompts "
            f"({self.workload.name}) x {self.repeats} repeats = {self.total}; {self.pending} to "
            f"measure ({self.total - self.pending} already measured)",
            f"  processes: {self.processes}",
        ]
        if self.context:
            out.append(f"  context: {self.context}")
        for label, why in sorted(self.workload.left_out_classes().items()):
            out.append(f"  left out: {class_words(label)} ({label}): {why}")
        for name, why in sorted(self.unmeasurable.items()):
            out.append(f"  not measurable this way: {name}: {why}")
        out += [f"  note: {hint}" for hint in self.hints]
        return out

    def estimate_line(self, model_s: float, starts: int, speeds: Speeds, source: str) -> str:
        """The time it takes on the wall clock (and at real speed on a simulator)."""
        wall = wall_s(model_s, self.clock_scale) + starts * speeds.start_s
        text = f"estimated time: ~{format_duration(wall)} ({source}: {speeds.describe()}"
        if starts:
            text += f"; {starts} backend start(s)"
        text += ")"
        if self.clock_scale != 1.0:
            text += (
                f"; at real speed (the simulator runs {self.clock_scale:g}x fast) the requests "
                f"take ~{format_duration(model_s)}"
            )
        return text + ". The progress corrects it as it measures; Ctrl-C keeps what was measured."

"""The end of a run: the table and what it could not measure, the files, the exit code.

Exit codes (``EXIT_CODES``, also in ``--help`` and docs/tune.md):

- 0: every class of the plan was measured.
- 1: nothing was measured; no outputs are written.
- 2: bad arguments or config, another run's results in OUT, or tune refused to start (a second
  copy of the weights on the GPU the service uses).
- 3: incomplete: a class of the plan got no data, because its prompts do not fit the server's
  context or every request of it failed. The outputs are written and name each such class.
- 4: measured, but ``--apply`` was not done (a provisional result, or the config or the learned
  file could not be written); the outputs say why.
- 130: interrupted (Ctrl-C); the outputs are written from what was measured, a rerun resumes.
"""

from __future__ import annotations

import shlex
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.routing.stats import LearnedStats
from proxy.tune.measure.failures import Failures
from proxy.tune.measure.reading import Measurement
from proxy.tune.plan.grid import QUICK_GRID
from proxy.tune.report import chart
from proxy.tune.report.analysis import Table, analyse
from proxy.tune.report.labels import class_words
from proxy.tune.report.outputs import (
    RunReport,
    profiles_toml,
    render_table,
    rows,
    write_recommendation,
    write_results,
)
from proxy.tune.report.recommend import (
    Recommendation,
    measured_headline,
    recommend,
    seed_state,
)
from proxy.tune.run.job import Job

NOT_REACHED = "not reached (interrupted): a rerun with the same command measures it"
EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3
EXIT_NOT_APPLIED = 4
EXIT_INTERRUPTED = 130
EXIT_CODES = """exit codes:
  0    every class of the plan was measured
  1    nothing was measured (no outputs written)
  2    bad arguments or config, another run's results in --out, or tune refused to start
       (a second copy of the weights on the GPU the running service uses)
  3    incomplete: a class of the plan got no data (its prompts do not fit the server's
       context, or every request of it failed); the outputs name each such class and why
  4    measured, but --apply was not done (a provisional result, or the config or state
       file could not be written); the outputs say why
  130  interrupted (Ctrl-C): outputs written from what was measured; a rerun resumes"""


@dataclass
class Outcome:
    """What the run produced, for --apply and the exit code."""

    code: int
    table: Table | None = None
    rec: Recommendation | None = None
    measurements: list[Measurement] = field(default_factory=list)

    def seeder(self, job: Job) -> Callable[[LearnedStats], LearnedStats]:
        """Adds this run's measurements to a state (the service's own, when applying)."""
        assert self.table is not None and self.rec is not None
        table, rec, ms = self.table, self.rec, self.measurements

        def seed(base: LearnedStats) -> LearnedStats:
            return seed_state(table, rec, ms, job.routing, job.model, base)

        return seed


def finish(job: Job, failures: Failures, *, interrupted: bool) -> Outcome:
    """Analyse, print and write the outputs; the exit code before any --apply."""
    out = job.args.out
    workload = job.workload
    if workload is None:
        _say("nothing measured: no outputs written")
        return Outcome(EXIT_INTERRUPTED if interrupted else EXIT_NOTHING)
    measurements = [m for m in job.store.measurements() if m.setting in {s.name for s in job.grid}]
    table = analyse(measurements, workload, job.grid, job.routing, job.model)
    if not table.cells:
        _say("nothing measured yet: no outputs written")
        if failures.counts:
            _say("failures:\n" + failures.table())
        return Outcome(EXIT_INTERRUPTED if interrupted else EXIT_NOTHING)
    table_rows = rows(table)
    no_data = _no_data(job, measurements, failures, interrupted=interrupted)
    report = RunReport(
        model=job.model,
        workload=workload.name,
        requests=sum(c.requests for c in table.cells),
        repeats_asked=job.repeats,
        repeats_measured=max(c.repeats for c in table.cells),
        when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        left_out=workload.left_out_classes(),
        no_data=no_data,
        failures=failures.rows(),
        busy=_busy(measurements),
        unmeasurable=dict(job.unmeasurable),
        interrupted=interrupted,
    )
    rec = recommend(table, interrupted=interrupted)
    print(render_table(table_rows))
    _print_gaps(report, failures)
    write_results(out, table_rows, report, rec)
    stats = seed_state(table, rec, measurements, job.routing, job.model)
    write_recommendation(out, profiles_toml(rec, report), stats)
    _print_verdict(job, table, rec, interrupted)
    for note in rec.notes:
        print(f"note: {note}")
    if chart.available():
        charts = chart.write_charts(out, table_rows, job.model)
        print(f"charts: {len(charts)} PNG files in {out} (one per class, and {chart.SUMMARY})")
    else:
        print(f"no charts: matplotlib is not installed here; {chart.install_command()}")
    print(f"written: {out}/results.csv, results.json, profiles.toml, routing-state.json")
    if interrupted:
        code = EXIT_INTERRUPTED
    elif no_data:
        code = EXIT_INCOMPLETE
        print(f"incomplete (exit {code}): {len(no_data)} class(es) of the plan have no data")
    else:
        code = EXIT_OK
    return Outcome(code, table, rec, measurements)


def _print_verdict(job: Job, table: Table, rec: Recommendation, interrupted: bool) -> None:
    """What was measured first (a provisional run's headline is its finding, not "off"), then
    the profiles, and for a provisional run the command that confirms it."""
    names = ", ".join(p.name for p in rec.profiles)
    headline = measured_headline(table)
    if not rec.provisional:
        if headline is not None:
            print(f"\nmeasured: {headline}")
        print(f"recommended profiles: {names}")
        return
    if headline is not None:
        print(f"\nmeasured (PROVISIONAL: {rec.provisional}): {headline}")
    print(f"confirm with: {confirm_command(job.args, interrupted=interrupted)}")
    print(
        f"recommended profiles for now: {names} (PROVISIONAL: nothing over off is recommended "
        "without a spread; the confirming run keeps what was measured and adds the repeats)"
    )


def confirm_command(args: Any, *, interrupted: bool) -> str:
    """The command that confirms a provisional run in the same folder: the same grid with the
    default repeats (or the same command, after Ctrl-C); a key given is shown as KEY."""
    words = ["mtp-proxy", "tune"]
    if args.url:
        words += ["--url", str(args.url)]
        words += ["--admin-key", "KEY"] if args.admin_key else []
    elif args.config is not None:
        words += ["--config", str(args.config)]
    words += ["--model", args.model] if args.model else []
    words += ["--workload", args.workload] if args.workload != "builtin" else []
    words += ["--mode", args.mode] if getattr(args, "mode", "auto") != "auto" else []
    if getattr(args, "time_scale", None) is not None:
        words += ["--time-scale", f"{args.time_scale:g}"]
    grid = QUICK_GRID if args.quick else args.settings
    words += ["--settings", grid] if grid else []
    repeats = args.repeats if interrupted and args.repeats else max(args.repeats or 0, 3)
    words += ["--repeats", str(repeats), "--out", str(args.out)]
    return shlex.join(words)


def _no_data(
    job: Job, measurements: list[Measurement], failures: Failures, *, interrupted: bool
) -> dict[str, str]:
    """Classes of the plan without one measured request, and why: left out, every request
    failed, or (after Ctrl-C) not reached."""
    workload = job.workload
    assert workload is not None
    out = dict(workload.left_out_classes())
    answered = {m.item for m in measurements}
    reasons = {row["class"]: row["reason"] for row in failures.rows()}
    for label in workload.planned_classes():
        items = [i for i, c in workload.classes.items() if c == label]
        if any(i in answered for i in items):
            continue
        if label in reasons:
            out[label] = f"every request failed ({reasons[label]})"
        elif interrupted:
            out[label] = NOT_REACHED
        else:
            out[label] = "not measured"
    return out


def _busy(measurements: list[Measurement]) -> str | None:
    beside = [m.others or 0.0 for m in measurements if not m.alone]
    if not beside:
        return None
    return (
        f"{len(beside)} of {len(measurements)} requests decoded beside others on the service "
        f"(mean {statistics.fmean(beside):.1f} others): their figures are in cells of their "
        "load level (@2: 2-3 decoding at once, @4: 4+), not seeded and not recommended from"
    )


def _print_gaps(report: RunReport, failures: Failures) -> None:
    if failures.counts:
        print("\nfailures (requests per class and reason):")
        print(failures.table())
    if report.left_out:
        print("\nleft out (the prompts do not fit the server's context):")
        for label, why in sorted(report.left_out.items()):
            print(f"  {class_words(label)} ({label}): {why}")
    others = {k: v for k, v in report.no_data.items() if k not in report.left_out}
    if others:
        print("\nno data:")
        for label, why in sorted(others.items()):
            print(f"  {class_words(label)} ({label}): {why}")
    if report.unmeasurable:
        print("\nnot measurable this way:")
        for name, why in sorted(report.unmeasurable.items()):
            print(f"  {name}: {why}")
    if report.busy:
        print(f"\nbusy: {report.busy}")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

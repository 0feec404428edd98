"""`mtp-proxy tune`: measure every candidate draft setting, then recommend profiles.

mtp-proxy tune --config FILE [--model NAME] [--workload builtin|FILE] [--settings GRID]
               [--out DIR] [--repeats N] [--mode auto|per-process|per-request]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from proxy.apis import API_OF_PATH
from proxy.config.settings import ConfigError, ModelSettings, Settings, load_settings
from proxy.routing.features import extract_features
from proxy.tune import chart
from proxy.tune.analysis import analyse
from proxy.tune.grid import DEFAULT_SPEC_TYPE, DraftSetting, GridError, default_grid, parse_grid
from proxy.tune.outputs import (
    profiles_toml,
    render_table,
    rows,
    write_recommendation,
    write_results,
)
from proxy.tune.progress import Progress, format_duration
from proxy.tune.recommend import recommend, seed_state
from proxy.tune.runner import Mode, TuneRun, plan_groups
from proxy.tune.store import ResultStore, StoreError
from proxy.tune.workload import (
    OUTPUT_CAP,
    Workload,
    WorkloadError,
    builtin_workload,
    file_workload,
)
from supervisor.flags import CTX_SIZE, positive_int

_DEFAULT_CTX = 4096
_LOAD_GUESS_S = 10.0  # seconds to load a model, for the estimate only
INTERRUPTED = 130


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune", help="measure draft settings on this machine and recommend profiles"
    )
    tune.add_argument("--config", type=Path, required=True, help="the TOML file you serve with")
    tune.add_argument("--model", help="model to tune (default: the only / first one)")
    tune.add_argument("--workload", default="builtin", help="builtin, or a bench.routing trace")
    tune.add_argument(
        "--settings",
        default="default",
        help="comma-separated: off or N[/M][@P] (n_max/n_min@p_min), e.g. off,1,2,2/1,3@0.5; "
        "default: off, n_max 1-4 x n_min 0-2, p_min 0.5/0.9 at n_max 2-3",
    )
    tune.add_argument("--out", type=Path, default=Path("tune-results"), help="results folder")
    tune.add_argument("--repeats", type=int, default=3, help="runs of the workload per setting")
    tune.add_argument(
        "--mode",
        choices=("auto", "per-process", "per-request"),
        default="auto",
        help="per-request varies the depth in one process (needs a backend that honours "
        '"speculative.n_max"); auto asks the supervisor\'s draft-control probe',
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    try:
        model = _pick_model(settings, args.model)
        grid = _grid(args.settings, model)
        workload = _workload(args.workload, model, settings)
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
    except (ValueError, GridError, WorkloadError) as exc:
        print(f"mtp-proxy tune: {exc}", file=sys.stderr)
        return 2
    store = ResultStore(args.out)
    try:
        store.open({"model": model.name, "workload": workload.fingerprint()})
    except StoreError as exc:
        print(f"mtp-proxy tune: {exc}", file=sys.stderr)
        return 2
    from proxy.ops.logs import configure_logging

    configure_logging("error", "console", secrets=[])  # the supervisor's lines would drown the bar
    return asyncio.run(_tune(args, settings, model, grid, workload, store))


async def _tune(
    args: argparse.Namespace,
    settings: Settings,
    model: ModelSettings,
    grid: list[DraftSetting],
    workload: Workload,
    store: ResultStore,
) -> int:
    scale = settings.routing.clock_scale
    job = TuneRun(
        model=model,
        supervisor=settings.supervisor,
        workload=workload,
        repeats=args.repeats,
        store=store,
        progress=Progress(0, 0.0),
        mode=_mode(args.mode),
        clock_scale=scale,
    )
    pending = sum(len(job.pending(s)) for s in grid)
    todo = [s for s in grid if job.pending(s)]
    processes = len(plan_groups(todo, per_request=job.mode == "per-request"))
    estimate = _estimate(job, grid, settings) + processes * _LOAD_GUESS_S
    starts = f"{'up to ' if job.mode == 'auto' else ''}{processes} process starts"
    job.progress = Progress(pending, estimate)
    print(
        f"tune {model.name}: {len(grid)} settings x {len(workload.items)} requests "
        f"({workload.name}) x {args.repeats} repeats; {pending} requests to measure "
        f"({len(grid) * len(workload.items) * args.repeats - pending} already in {args.out})",
        file=sys.stderr,
    )
    if pending:
        print(
            f"estimated time: ~{format_duration(estimate)} ({starts} at "
            f"~{_LOAD_GUESS_S:g}s, prefill {settings.routing.prior_prefill_tok_s:g} tok/s and "
            f"decode {settings.routing.prior_decode_tok_s:g} tok/s from [routing] priors"
            + (f", time scale {scale:g}" if scale != 1.0 else "")
            + "); the bar refines it as it measures. Ctrl-C stops and keeps what was measured.",
            file=sys.stderr,
        )
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(job.run(grid))
    # Installed until the outputs are written: a Ctrl-C then is only noted, not a traceback.
    loop.add_signal_handler(signal.SIGINT, _interrupt, task)
    try:
        interrupted = await _measured(task)
        job.progress.close()
        for failure in job.failures[:10]:
            print(f"failed: {failure}", file=sys.stderr)
        written = _write_outputs(args, settings, model, grid, workload, store)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if interrupted:
        print(
            "interrupted: outputs written from what was measured; rerun to go on", file=sys.stderr
        )
        return INTERRUPTED
    return 0 if written else 1


async def _measured(task: asyncio.Task[None]) -> bool:
    """Wait for the measuring task; True if Ctrl-C cancelled it."""
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


def _interrupt(task: asyncio.Task[None]) -> None:
    """The first Ctrl-C cancels the measuring; later ones must not cut the backend's stop short
    (asyncio's own handler raises KeyboardInterrupt on the second, which can leave a
    llama-server holding the GPU)."""
    if task.cancelling() or task.done():
        print("tune: already stopping; the outputs follow", file=sys.stderr)
        return
    task.cancel()


def _write_outputs(
    args: argparse.Namespace,
    settings: Settings,
    model: ModelSettings,
    grid: list[DraftSetting],
    workload: Workload,
    store: ResultStore,
) -> bool:
    measurements = store.measurements()
    table = analyse(measurements, workload, grid, settings.routing, model.name)
    if not table.cells:
        print("nothing measured yet: no outputs written", file=sys.stderr)
        return False
    table_rows = rows(table)
    print(render_table(table_rows))
    write_results(args.out, table_rows)
    rec = recommend(table)
    n = sum(c.requests for c in table.cells)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    summary = f"{n} requests ({workload.name} workload), {args.repeats} repeats, {when}."
    stats = seed_state(table, rec, measurements, settings.routing, model.name)
    write_recommendation(args.out, profiles_toml(rec, model.name, summary), stats)
    print(f"\nrecommended profiles: {', '.join(p.name for p in rec.profiles)}")
    if chart.available():
        charts = chart.write_charts(args.out, table_rows, model.name)
        print(f"charts: {len(charts)} PNG files in {args.out}")
    else:
        print("no charts: matplotlib is not installed (pip install 'mtp-proxy[plot]')")
    print(f"written: {args.out}/results.csv, results.json, profiles.toml, routing-state.json")
    return True


def _pick_model(settings: Settings, name: str | None) -> ModelSettings:
    if name is None:
        return settings.models[0]
    for model in settings.models:
        if name in model.names():
            return model
    known = ", ".join(m.name for m in settings.models)
    raise ValueError(f"no model {name!r} in the config (models: {known})")


def _grid(text: str, model: ModelSettings) -> list[DraftSetting]:
    types = (p.spec_type for p in model.profiles if p.spec_type not in (None, "none"))
    spec_type = next((t for t in types if t), DEFAULT_SPEC_TYPE)
    return default_grid(spec_type) if text == "default" else parse_grid(text, spec_type)


def _workload(spec: str, model: ModelSettings, settings: Settings) -> Workload:
    if spec == "builtin":
        return builtin_workload(_context(model), settings.routing.context_buckets, model.name)
    return file_workload(Path(spec), model.name)


def _context(model: ModelSettings) -> int:
    """The model's context: -c / --ctx-size of its args."""
    return positive_int(model.args, CTX_SIZE) or _DEFAULT_CTX


def _mode(text: str) -> Mode:
    if text == "per-process":
        return "per-process"
    if text == "per-request":
        return "per-request"
    return "auto"


def _estimate(job: TuneRun, grid: list[DraftSetting], settings: Settings) -> float:
    """Seconds the pending requests take at the routing priors' speeds."""
    routing = settings.routing
    per_item = {}
    for item in job.workload.items:
        body = item.request("tune")
        f = extract_features(
            API_OF_PATH[item.path], body, chars_per_token=routing.chars_per_token,
            session_header=None, pin_header=None,
        )  # fmt: skip
        out = f.max_tokens or OUTPUT_CAP
        per_item[item.id] = (
            f.est_prompt_tokens / routing.prior_prefill_tok_s + out / routing.prior_decode_tok_s
        )
    total = sum(per_item[item.id] for s in grid for _, item in job.pending(s))
    return total / routing.clock_scale

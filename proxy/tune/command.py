"""`mtp-proxy tune`: measure draft settings on this machine, recommend profiles, apply them.

mtp-proxy tune --url URL --admin-key=KEY [...]   through the running service: one copy of the
                                                 weights, its users served meanwhile
mtp-proxy tune --config FILE [...]               tune's own processes, for a box whose service
                                                 is stopped
common: [--model NAME] [--workload builtin|FILE] [--settings GRID | --quick] [--repeats N]
        [--out DIR] [--apply CONFIG]; own processes: [--mode ...] [--time-scale X]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp

from proxy.config.overrides import (
    UNIT,
    LearnedFileInForce,
    effective_learned_file,
    same_file,
    service_variables,
    unit_runs,
)
from proxy.config.settings import ConfigError, ModelSettings, Settings, load_settings
from proxy.tune.measure.failures import Failures
from proxy.tune.measure.store import ResultStore, StoreError
from proxy.tune.plan.context import ContextError
from proxy.tune.plan.estimate import WarmUpError
from proxy.tune.plan.grid import (
    DEFAULT_SPEC_TYPE,
    QUICK_GRID,
    DraftSetting,
    GridError,
    default_grid,
    parse_grid,
)
from proxy.tune.plan.workload import WorkloadError, file_workload
from proxy.tune.report.apply import (
    ApplyError,
    UnitProcess,
    reload_service,
    unit_process,
    write_config,
    write_state,
)
from proxy.tune.report.summary import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_NOT_APPLIED,
    EXIT_OK,
    EXIT_USAGE,
    Outcome,
    finish,
)
from proxy.tune.run.guard import second_copy_refusal
from proxy.tune.run.job import Job, JobError
from proxy.tune.run.own_job import OwnProcesses
from proxy.tune.run.own_run import Mode, TuneRun
from proxy.tune.run.service import ServiceError, ServiceInfo, read_service, running_service
from proxy.tune.run.service_job import ThroughService, await_reload
from supervisor.flags import CTX_SIZE, positive_int

INTERRUPTED = EXIT_INTERRUPTED
_TIME_SCALE = "--time-scale"


class Measuring(Protocol):
    job: Job

    async def measure(self) -> None: ...


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tune = commands.add_parser(
        "tune",
        help="measure draft settings on this machine and recommend profiles",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = tune.add_argument_group("where to measure")
    where.add_argument(
        "--url",
        help="the running service (e.g. http://127.0.0.1:8080): measure through it, on its "
        "own process; needs its admin key",
    )
    where.add_argument("--admin-key", help="the service's admin key (or MTP_PROXY_ADMIN_KEY)")
    where.add_argument(
        "--api-key", help="a client key, if the service wants one (or MTP_PROXY_API_KEY)"
    )
    where.add_argument(
        "--config",
        type=Path,
        help="without --url: the TOML file you serve with; tune starts its own processes "
        "(default: the embedded demo)",
    )
    what = tune.add_argument_group("what to measure")
    what.add_argument("--model", help="model to tune (default: the only / first one)")
    what.add_argument("--workload", default="builtin", help="builtin, or a bench.routing trace")
    what.add_argument(
        "--settings",
        default=None,
        help="comma-separated: off or N[/M][@P] (n_max/n_min@p_min), e.g. off,1,2,2/1,3@0.5; "
        "default: off, n_max 1-4 x n_min 0-2, p_min 0.5/0.9 at n_max 2-3",
    )
    what.add_argument(
        "--quick",
        action="store_true",
        help=f"a first look: the short grid {QUICK_GRID} and one repeat; it says which depth "
        "measured fastest, provisional, with the command that confirms it (it recommends "
        "nothing over off until then)",
    )
    what.add_argument("--repeats", type=int, default=None, help="runs of the workload (3)")
    what.add_argument("--out", type=Path, default=Path("tune-results"), help="results folder")
    own = tune.add_argument_group("tune's own processes (without --url)")
    own.add_argument(
        "--mode",
        choices=("auto", "per-process", "per-request"),
        default="auto",
        help="per-request varies the depth in one process (needs a backend that honours "
        '"speculative.n_max"); auto asks the supervisor\'s draft-control probe',
    )
    own.add_argument(
        _TIME_SCALE,
        type=float,
        default=None,
        help="a simulated model only: run its simulator this many times faster than real time "
        "(the estimate also says the time at real speed)",
    )
    tune.add_argument(
        "--apply",
        type=Path,
        metavar="CONFIG",
        help="write the recommended profiles into CONFIG (a backup is kept) and the seeded "
        "state where the service reads it, then reload the service",
    )


def run(args: argparse.Namespace) -> int:
    from proxy.observability.logs import configure_logging

    try:
        repeats, settings_text = _checked(args)
    except ValueError as exc:
        print(f"mtp-proxy tune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging("error", "console", secrets=[])  # the supervisor's lines would drown the bar
    if args.url:
        return asyncio.run(_through_service(args, repeats, settings_text))
    return _own_processes(args, repeats, settings_text)


def _checked(args: argparse.Namespace) -> tuple[int, str]:
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.quick and args.settings:
        raise ValueError("--quick brings its own short grid: leave out --settings")
    if args.url and args.config:
        raise ValueError("--url measures through the service: leave out --config")
    if args.url and (args.mode != "auto" or args.time_scale is not None):
        raise ValueError("--mode and --time-scale are for tune's own processes, not --url")
    if args.time_scale is not None and args.time_scale <= 0:
        raise ValueError("--time-scale must be positive")
    if args.workload != "builtin":
        file_workload(Path(args.workload), "check")  # WorkloadError (a ValueError) when bad
    return repeats, QUICK_GRID if args.quick else (args.settings or "default")


# --- tune's own processes ----------------------------------------------------------------


def _own_processes(args: argparse.Namespace, repeats: int, settings_text: str) -> int:
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    try:
        model = _pick_model(settings, args.model)
        if args.time_scale is not None:
            model, settings = _time_scaled(settings, model, args.time_scale)
        grid = _grid(settings_text, model)
    except (ValueError, GridError, WorkloadError) as exc:
        print(f"mtp-proxy tune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    refusal = second_copy_refusal(settings, model)
    if refusal is not None:
        print(f"mtp-proxy tune: refused: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    job = Job(
        args=args,
        model=model.name,
        routing=settings.routing,
        grid=grid,
        store=ResultStore(args.out),
        repeats=repeats,
        clock_scale=settings.routing.clock_scale,
        via="processes",
        configured_ctx=positive_int(model.args, CTX_SIZE),
    )
    if model.backend == "simulator" and job.clock_scale == 1.0:
        job.hints.append(
            "the simulator runs at real speed: --time-scale 100 runs it 100x faster (the "
            "estimate still says the time at real speed)"
        )
    runner = TuneRun(model, settings.supervisor, _mode(args.mode), job.clock_scale)
    own = OwnProcesses(job, settings, model, runner)

    async def apply(outcome: Outcome) -> int:
        return await _apply_own(args, job, outcome, settings)

    return asyncio.run(_drive(own, lambda: _failures(own.runner.recorder), apply))


def _time_scaled(
    settings: Settings, model: ModelSettings, scale: float
) -> tuple[ModelSettings, Settings]:
    """The simulated model run ``scale`` times faster, and the clock read alike."""
    if model.backend != "simulator":
        raise ValueError("--time-scale applies to a simulated model only")
    args = list(model.args)
    if _TIME_SCALE in args:
        i = args.index(_TIME_SCALE)
        del args[i : i + 2]
    scaled = model.model_copy(update={"args": [*args, _TIME_SCALE, f"{scale:g}"]})
    routing = settings.routing.model_copy(update={"clock_scale": scale})
    models = [scaled if m is model else m for m in settings.models]
    return scaled, settings.model_copy(update={"models": models, "routing": routing})


async def _apply_own(
    args: argparse.Namespace, job: Job, outcome: Outcome, settings: Settings
) -> int:
    config: Path = args.apply
    where = effective_learned_file(config, service_variables(config, os.environ))
    unit = unit_process(UNIT.name) if unit_runs(config) else None  # a unit of this config
    pid, url, unreachable = None, None, None
    key = settings.server.admin_key
    if running_service(settings.server.host, settings.server.port) is not None:
        url = f"http://{settings.server.host}:{settings.server.port}"
        unreachable = (
            f"a service answers at {url}, but tune could not ask it which process it is "
            f"(server.admin_key of {config}): reload it with `sudo systemctl reload mtp-proxy` "
            "or `kill -HUP PID`"
        )
        if key is not None:
            try:
                async with aiohttp.ClientSession(trust_env=False) as session:
                    info = await read_service(session, url, key.get_secret_value())
                pid = info.pid
                if info.learned_file is not None:
                    where = LearnedFileInForce(Path(info.learned_file), f"the service at {url}")
            except ServiceError:
                pid = None
    secret = None if key is None else key.get_secret_value()  # to see the reload done
    return await _apply(
        job, outcome, config, where, pid, unit, url=url, admin_key=secret, unreachable=unreachable
    )


# --- through the running service ---------------------------------------------------------


async def _through_service(args: argparse.Namespace, repeats: int, settings_text: str) -> int:
    url = str(args.url).rstrip("/")
    admin_key = args.admin_key or os.environ.get("MTP_PROXY_ADMIN_KEY")
    api_key = args.api_key or os.environ.get("MTP_PROXY_API_KEY")
    try:
        async with aiohttp.ClientSession(trust_env=False) as session:
            info = await read_service(session, url, admin_key)
        served = info.model(args.model)
        if not served.decided:
            raise ServiceError(
                f"the service is still deciding how to serve {served.name} (its draft-control "
                "probe): retry in a minute"
            )
        grid = _parse(settings_text, served.spec_type())
        routes, refused = served.routes(grid)
        if not routes:
            raise ServiceError(f"no setting of the grid can be served by {url}: {refused}")
    except (ServiceError, GridError) as exc:
        print(f"mtp-proxy tune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    job = Job(
        args=args,
        model=served.name,
        routing=info.routing,
        grid=[s for s in grid if s in routes],
        store=ResultStore(args.out),
        repeats=repeats,
        clock_scale=info.routing.clock_scale,
        via="service",
        configured_ctx=served.context,
        unmeasurable=refused,
    )
    job.speeds = job.previous()[1]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    through = ThroughService(job, info, served, routes, admin_key, headers)

    async def apply(outcome: Outcome) -> int:
        return await _apply_service(args, job, outcome, info, served.start_depth, admin_key)

    return await _drive(through, lambda: _failures(job.recorder), apply)


async def _apply_service(
    args: argparse.Namespace,
    job: Job,
    outcome: Outcome,
    info: ServiceInfo,
    start_depth: int,
    admin_key: str | None,
) -> int:
    config: Path = args.apply
    where = (
        LearnedFileInForce(
            Path(info.learned_file), f"the service at {info.url} (GET /admin/service)"
        )
        if info.learned_file
        else LearnedFileInForce(None, f"the service at {info.url} keeps no learned file")
    )
    pid: int | None = info.pid
    unreachable = None
    if info.config_path is None or not same_file(Path(info.config_path), config):
        unreachable = (
            f"the service at {info.url} (pid {info.pid}) reads "
            f"{info.config_path or 'its embedded default'}, not {config}: it is not reloaded "
            "and serves what it did (apply to its own file, or restart it with --config "
            f"{config})"
        )
        pid = None
    found = unit_process(UNIT.name)
    unit = found if found is not None and found.pid == info.pid else None  # its own unit
    return await _apply(
        job, outcome, config, where, pid, unit, url=info.url, admin_key=admin_key,
        keep_start_depth=start_depth, unreachable=unreachable,
    )  # fmt: skip


# --- both ----------------------------------------------------------------------------------


async def _apply(
    job: Job,
    outcome: Outcome,
    config: Path,
    where: LearnedFileInForce,
    pid: int | None,
    unit: UnitProcess | None,
    *,
    url: str | None,
    admin_key: str | None,
    keep_start_depth: int | None = None,
    unreachable: str | None = None,
) -> int:
    """--apply: the config, the learned file, the reload (proxy.tune.report.apply). Each line
    says applied, not applied or note, and the exit code agrees: 4 when a part is not done."""
    rec = outcome.rec
    if rec is None or outcome.table is None:
        print("not applied: nothing was measured")
        return EXIT_NOT_APPLIED
    if rec.provisional:
        print(f"not applied: the result is provisional ({rec.provisional})")
        return EXIT_NOT_APPLIED
    try:
        lines = write_config(
            config, job.model, rec, job.args.out, keep_start_depth=keep_start_depth
        )
    except ApplyError as exc:
        print(f"not applied: {exc}")
        return EXIT_NOT_APPLIED
    state_lines, written = write_state(where, outcome.seeder(job), job.routing, job.args.out)
    asked_at = time.time()
    reload = reload_service(pid, unit, unreachable=unreachable)
    for line in lines:
        print(f"applied: {line}")
    state_word = {True: "applied", None: "note", False: "not applied"}[written]
    for line in state_lines:
        print(f"{state_word}: {line}")
    print(f"{'applied' if reload.done else 'not applied'}: {reload.line}")
    done = written is not False and reload.done
    if reload.pid is not None and url is not None:
        seen, served = await await_reload(
            url, admin_key, job.model, [p.name for p in rec.profiles], 600.0,
            state_after=asked_at if written else None,
        )  # fmt: skip
        print(f"{'applied' if served else 'not applied'}: {seen}")
        done = done and served
    return outcome.code if done else EXIT_NOT_APPLIED


async def _drive(
    measuring: Measuring,
    failures: Callable[[], Failures],
    apply: Callable[[Outcome], Awaitable[int]],
) -> int:
    """Measure (Ctrl-C stops it and keeps what was measured), write the outputs, apply."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(measuring.measure())
    # Installed until the outputs are written: a Ctrl-C then is only noted, not a traceback.
    loop.add_signal_handler(signal.SIGINT, _interrupt, task)
    try:
        try:
            interrupted = await _measured(task)
        except (JobError, StoreError, ServiceError, ContextError, WarmUpError) as exc:
            _close(measuring.job)
            print(f"mtp-proxy tune: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _close(measuring.job)
        if interrupted:
            print(
                "interrupted: outputs written from what was measured; rerun to go on",
                file=sys.stderr,
            )
        outcome = finish(measuring.job, failures(), interrupted=interrupted)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if measuring.job.args.apply is not None and not interrupted:
        applied = await apply(outcome)
        if applied == EXIT_NOT_APPLIED:
            return EXIT_NOT_APPLIED
    return outcome.code


def _close(job: Job) -> None:
    if job.recorder is not None:
        job.recorder.progress.close()


def _failures(recorder: object) -> Failures:
    failures = getattr(recorder, "failures", None)
    return failures if isinstance(failures, Failures) else Failures()


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
    return _parse(text, next((t for t in types if t), DEFAULT_SPEC_TYPE))


def _parse(text: str, spec_type: str) -> list[DraftSetting]:
    return default_grid(spec_type) if text == "default" else parse_grid(text, spec_type)


def _mode(text: str) -> Mode:
    if text == "per-process":
        return "per-process"
    if text == "per-request":
        return "per-request"
    return "auto"


__all__ = ["EXIT_OK", "INTERRUPTED", "add_parser", "run"]

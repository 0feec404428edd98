"""The aiohttp application and `serve`, which runs it until a signal or a test says stop.

Long-lived things live in cleanup contexts (created at start-up, closed at shutdown in reverse
order) and are reached through the `STATE` app key; nothing is global, so two apps can run in one
test process, each with its own Prometheus registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.apis import API_OF_PATH
from proxy.config.settings import Settings
from proxy.lifecycle import sdnotify
from proxy.lifecycle.drain import REQUESTS, RequestCount, count_requests, drain
from proxy.lifecycle.fail_fast import ModelCannotStartError
from proxy.lifecycle.learned_file import LearnedFile
from proxy.lifecycle.reload import Reloader
from proxy.observability.access_log import access_log_middleware
from proxy.observability.collectors import BackendsCollector
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.recent import RecentRequests
from proxy.plans.adopt import apply_plans, register_backends
from proxy.plans.auto import on_ready, on_replaced
from proxy.plans.learned_keys import learned_keys
from proxy.plans.plan import describe_plan, plans_of
from proxy.routing.calibrate import Calibrator, Target
from proxy.routing.priors import adopt
from proxy.routing.router import Router
from proxy.routing.stats import LearnedStats, dump_stepwise
from proxy.serving import admin, handlers, passthrough
from proxy.serving.admission import Admission
from proxy.serving.backends import LiveBackend, LiveBackends
from proxy.serving.connections import (
    CONNECTIONS,
    ConnectionGuard,
    GuardedSite,
    bind_listener,
    connection_cap,
    track_requests,
)
from proxy.serving.expect import expect_handler
from proxy.serving.forward import Timeouts
from proxy.serving.middlewares import auth_middleware, error_middleware
from proxy.serving.model_names import ModelCatalog
from proxy.state import STATE, ProxyState
from proxy.ui import routes as ui
from supervisor.backend import Backend
from supervisor.connections import backend_connector
from supervisor.states import BackendState
from supervisor.supervisor import Supervisor

log = structlog.get_logger("proxy")

ShutdownTrigger = Callable[[], Awaitable[object]]
_CUT_GRACE_S = 0.1  # after the drain, twice: aiohttp waits, cancels, waits, then cuts
_BACKLOG = 4096


def create_app(settings: Settings, *, registry: CollectorRegistry) -> web.Application:
    server = settings.server
    backends = LiveBackends()
    path = settings.routing.learned_file
    learned_file = None if path is None else LearnedFile(path)
    state = ProxyState(
        settings=settings,
        registry=registry,
        metrics=ProxyMetrics(registry),
        backends=backends,
        models=ModelCatalog(settings.models, settings.model_names),
        router=Router(settings.routing, backends, _load_stats(settings, learned_file)),
        admission=Admission(server.max_queue, server.queue_timeout_s),
        timeouts=Timeouts(
            server.connect_timeout_s,
            server.first_byte_timeout_s,
            server.idle_timeout_s,
            server.send_timeout_s,
        ),
        plans=plans_of(settings),
        learned_file=learned_file,
        recent=RecentRequests(
            settings.ui.recent_requests, settings.ui.chart_window_s, settings.ui.chart_step_s
        ),
    )
    apply_plans(state)
    app = web.Application(
        client_max_size=server.max_body_bytes,
        middlewares=[
            track_requests,
            count_requests,
            access_log_middleware,
            error_middleware,
            auth_middleware,
        ],
    )
    app[STATE] = state
    cap = connection_cap(server.max_connections, server.fd_reserve)
    app[CONNECTIONS] = ConnectionGuard(cap, server.header_timeout_s, registry)
    app[REQUESTS] = RequestCount()
    state.metrics.prime({m.name: [p.name for p in m.profiles] for m in settings.models})
    registry.register(BackendsCollector(state))
    _add_routes(app)
    app.cleanup_ctx.append(_connection_deadlines)
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(_supervised_backends)
    app.cleanup_ctx.append(_housekeeping)
    return app


def _load_stats(settings: Settings, learned_file: LearnedFile | None) -> LearnedStats:
    # Read once at start-up, before the loop serves anything (the file is small), and held to
    # what this box runs: a model learned on another build, file or type starts from priors.
    routing = settings.routing
    stats = LearnedStats(routing) if learned_file is None else learned_file.load(routing)
    adopt(stats, learned_keys(settings), routing.prior_weight)
    return stats


def _add_routes(app: web.Application) -> None:
    expect = expect_handler  # every route answers an Expect header itself, not aiohttp
    for path, api in API_OF_PATH.items():
        app.router.add_post(path, handlers.generation_handler(api), expect_handler=expect)
    app.router.add_get("/v1/models", handlers.list_models, expect_handler=expect)
    app.router.add_get("/models", handlers.list_models, expect_handler=expect)
    app.router.add_get("/health", handlers.health, expect_handler=expect)
    # llama-server's alias; the backends' health
    app.router.add_get("/v1/health", handlers.health, expect_handler=expect)
    app.router.add_get("/metrics", handlers.metrics, expect_handler=expect)
    passthrough.add_routes(app)
    admin.add_routes(app)
    ui.add_routes(app)


async def _connection_deadlines(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(app[CONNECTIONS].run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    # One session for every backend: keep-alive connections dropped before llama-server drops
    # them, no per-host cap (the policy and the backends' slots bound concurrency).
    connector = backend_connector(enable_cleanup_closed=True)
    # No cookie jar: a cookie one backend set must never ride along on other clients' requests.
    # Accept-Encoding is set per request (identity: the telemetry reads plain bytes); aiohttp
    # would otherwise add "gzip, deflate" to every request.
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("Accept-Encoding",),
    )
    async with session:
        app[STATE].session = session
        yield
        app[STATE].session = None


async def _supervised_backends(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    for model in state.settings.models:
        for line in describe_plan(model, state.plans[model.name]):
            log.info("plan", model=model.name, line=line)
    specs, _ = register_backends(state)
    supervisor = Supervisor(
        specs,
        state.settings.supervisor,
        on_change=lambda backend: _track(state, backend),
        in_flight=state.backends.in_flight,
        before_ready=_calibration(state),
    )
    state.supervisor = supervisor
    await supervisor.start()
    try:
        yield
    finally:
        await supervisor.stop()  # waits for a reload under way (auto's fallback) to finish
        await asyncio.gather(*state.replans, return_exceptions=True)


def _calibration(state: ProxyState) -> Callable[[Backend], Awaitable[None]]:
    """The supervisor's before-ready hook: a process serving per-request depths that honours the
    field is calibrated (or finds its calibration in the learned file) before it is announced
    ready, so no client request runs beside the measurement (proxy.routing.calibrate)."""
    router = state.router
    calibrator = Calibrator(
        state.settings.routing,
        router.stats,
        router.calibrated,
        state.client,
        lambda: _save_stats(state),
    )

    async def before_ready(backend: Backend) -> None:
        plan = state.plans.get(backend.spec.model)
        live = state.backends.get(backend.name)
        url = backend.base_url
        if plan is None or not plan.per_request or live is None or url is None:
            return
        if backend.draft_control != "per-request":
            return
        spec = backend.spec
        target = Target(backend.name, spec.model, url, spec.argv, spec.url, live.slots, plan.depths)
        state.calibrating[backend.name] = time.monotonic()
        try:
            await calibrator.run(target)
        finally:
            state.calibrating.pop(backend.name, None)

    return before_ready


def _track(state: ProxyState, changed: Backend) -> None:
    """Mirror a supervised backend's state into LiveBackends the instant it changes."""
    if state.supervisor is None:
        return
    # While a changed backend is replaced, two share its name; the supervisor's answer for the
    # name is the one that serves (the old one until the new one is ready).
    current = state.supervisor.backend(changed.name)
    check = current.chat_template
    state.late_system[current.name] = None if check is None else check.late_system
    backend = state.backends.update(current.spec, current.state, current.base_url)
    if backend.ready:
        _read_spec_counters(state, backend)
        state.startup.saw_ready(backend.model)
        on_ready(state, current)
        on_replaced(state, current)
        state.admission.notify(backend.model, state.backends.free_slots(backend.model))
    elif current.state is BackendState.FAILED and not state.notified_ready:
        _judge_start_up(state, backend.model)
    _notify_ready_once_serving(state)


def _read_spec_counters(state: ProxyState, backend: LiveBackend) -> None:
    """A reading of a backend's draft counters as it becomes ready: the one before its first
    request, for the APIs whose answers carry no timings (proxy.serving.spec_counters)."""
    if state.session is None:
        return
    task = state.spec_counters.baseline(state.session, backend)
    state.background.add(task)
    task.add_done_callback(state.background.discard)


def _judge_start_up(state: ProxyState, model: str) -> None:
    """Still starting up and the model's backends all gave up before one was ever ready: the
    proxy stops (proxy.lifecycle.fail_fast); its last words go to the log and to systemd's
    status."""
    assert state.supervisor is not None
    line = state.startup.judge(model, state.supervisor.backends)
    if line is not None:
        log.error("model_cannot_start", model=model, message=line)
        sdnotify.notify(f"STATUS={line}")


def _notify_ready_once_serving(state: ProxyState) -> None:
    """systemd Type=notify: READY=1 once the listener is up and every model has a ready
    backend, whichever comes last (backends start before the listener, and with stagger_s
    the first may be ready long before it: systemd would then send traffic to a closed port)."""
    if state.notified_ready or not state.listening:
        return
    if all(state.backends.ready_of_model(m) for m in state.models.primary_names()):
        state.notified_ready = True
        sdnotify.notify("READY=1")


async def _housekeeping(app: web.Application) -> AsyncIterator[None]:
    """Save the learned statistics now and then (and at exit); forget idle sessions."""
    state = app[STATE]
    task = asyncio.get_running_loop().create_task(_every_interval(state))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        state.bookkeeping.flush()  # the requests drained last: their log lines and statistics
        for pending in list(state.background):
            pending.cancel()
        await _save_stats(state)


async def _every_interval(state: ProxyState) -> None:
    while True:
        await asyncio.sleep(state.settings.routing.state_save_interval_s)
        state.router.forget_idle_sessions()
        await _save_stats(state)


async def _save_stats(state: ProxyState) -> None:
    learned_file = state.learned_file
    if learned_file is None:
        return
    state.bookkeeping.flush()
    # On the loop, a step at a time: consistent with the requests around it, never a stall.
    data = await dump_stepwise(state.router.stats)
    try:
        await asyncio.get_running_loop().run_in_executor(None, learned_file.save, data)
    except OSError as exc:
        state.metrics.state_save_failures.inc()  # and the live page's warnings (serving.live)
        log.warning("stats_save_failed", path=str(learned_file.path), error=str(exc))


async def serve(
    settings: Settings,
    *,
    shutdown_trigger: ShutdownTrigger | None = None,
    registry: CollectorRegistry | None = None,
    on_listening: Callable[[int], None] | None = None,
    config_path: Path | None = None,
) -> None:
    """Run the proxy until `shutdown_trigger` completes (default: SIGTERM or SIGINT).

    With the default trigger, SIGHUP re-reads `config_path` and applies its models (reload.py).
    At shutdown the listener closes first; requests in flight get drain_timeout_s to finish,
    then what is left is cut and the backends are stopped. The port is bound before any backend
    is spawned: one in use raises ListenError at once. A model whose backends all fail before
    one was ever ready (proxy.lifecycle.fail_fast) shuts the proxy down as a signal would, then
    raises ModelCannotStartError.
    """
    server = settings.server
    sock = bind_listener(server.host, server.port, _BACKLOG)
    with contextlib.closing(sock):
        await _serve_on(sock, settings, shutdown_trigger, registry, on_listening, config_path)


async def _serve_on(
    sock: socket.socket,
    settings: Settings,
    shutdown_trigger: ShutdownTrigger | None,
    registry: CollectorRegistry | None,
    on_listening: Callable[[int], None] | None,
    config_path: Path | None,
) -> None:
    app = create_app(settings, registry=registry or CollectorRegistry())
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=_CUT_GRACE_S,
        keepalive_timeout=settings.server.keepalive_timeout_s,
        auto_decompress=False,  # bodies are inflated by proxy.serving.body, after the key check
    )
    # Absolute, as /admin/service shows it (no file access: one getcwd, before any request).
    absolute = None if config_path is None else os.path.abspath(config_path)  # noqa: ASYNC240
    app[STATE].config_path = None if absolute is None else Path(absolute)
    reloader = Reloader(app[STATE], config_path)
    stop = asyncio.Event()
    # Handled from the start: a SIGTERM or SIGHUP while the backends spawn (before the listener
    # is up) would otherwise kill the proxy by default and leave its llama-servers orphaned.
    with _signals_handled(stop, reloader, enabled=shutdown_trigger is None):
        await runner.setup()
        _tune_gc()
        try:
            site = GuardedSite(runner, sock, app[CONNECTIONS], _BACKLOG)
            await site.start()
            port = _bound_port(runner)
            log.info("listening", host=settings.server.host, port=port)
            _log_live_page(settings, port)
            app[STATE].listening = True
            _notify_ready_once_serving(app[STATE])
            if on_listening is not None:
                on_listening(port)
            await _first_of(
                stop.wait() if shutdown_trigger is None else shutdown_trigger(),
                app[STATE].startup.wait(),
            )
            log.info("shutting_down")
            sdnotify.notify("STOPPING=1")  # the stop begins now: the drain is part of it
        finally:
            reloader.close()  # a reload under way ends once the supervisor stops
            await drain(runner, app[REQUESTS], settings.supervisor.drain_timeout_s)
            await runner.cleanup()
            await reloader.wait_closed()
    if app[STATE].startup.failure is not None:
        raise ModelCannotStartError(app[STATE].startup.failure)


async def _first_of(*waits: Awaitable[object]) -> None:
    """Wait until one of `waits` completes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()  # a trigger's own exception goes on up


def _log_live_page(settings: Settings, port: int) -> None:
    """Where the live page is (proxy.ui), and whether it can show anything."""
    if settings.ui.enabled:
        url = ui.link(settings.server.host, port)
        log.info("live_page", url=url, admin_key_set=settings.server.admin_key is not None)


def _tune_gc() -> None:
    # Parsing a 100k-token prompt makes thousands of small objects; with the default thresholds
    # the cyclic collector then runs mid-request (~10 ms p99 spikes). The long-lived start-up
    # objects are frozen out of its sight and young collections made rarer.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _bound_port(runner: web.AppRunner) -> int:
    address = runner.addresses[0]
    return int(address[1])


@contextlib.contextmanager
def _signals_handled(stop: asyncio.Event, reloader: Reloader, *, enabled: bool) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop`; SIGHUP asks for a reload (proxy.lifecycle.reload)."""
    if not enabled:  # a caller's own shutdown trigger (tests, embedding) owns the signals
        yield
        return
    loop = asyncio.get_running_loop()
    handlers = {signal.SIGTERM: stop.set, signal.SIGINT: stop.set, signal.SIGHUP: reloader.request}
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in handlers:
            loop.remove_signal_handler(sig)

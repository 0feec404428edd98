"""One backend's lifecycle: an explicit state machine around a child process (or a remote URL).

Modelled on llama-swap's internal/process: one owner of the state (the run task, or stop and
restart under the lock), every change checked against `states.TRANSITIONS`, logged and reported.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Collection
from urllib.parse import urlsplit

import aiohttp
import structlog

from supervisor.backend import Backend, BeforeReady, InFlight, OnChange
from supervisor.causes import diagnose
from supervisor.draft_probe import DraftControl, probe_draft_control
from supervisor.flags import speculation_in
from supervisor.health import check_health
from supervisor.process import ChildProcess, describe_exit, free_loopback_port
from supervisor.settings import SupervisorSettings
from supervisor.spec import BackendSpec
from supervisor.states import TRANSITIONS, BackendState, check_transition
from supervisor.template_check import ChatTemplateCheck, check_chat_template
from supervisor.urls import shown

S = BackendState
HOST = "127.0.0.1"
_ERROR_TAIL = 10  # output lines quoted in an error message
_DRAIN_POLL_S = 0.05


class Child:
    """One backend. Implements the read-only `Backend` view; Supervisor drives the rest."""

    def __init__(
        self,
        spec: BackendSpec,
        settings: SupervisorSettings,
        *,
        on_change: OnChange | None = None,
        in_flight: InFlight | None = None,
        before_ready: BeforeReady | None = None,
    ) -> None:
        self._spec = spec
        self._settings = settings
        self._on_change = on_change
        self._in_flight = in_flight
        self._before_ready = before_ready
        self._log = structlog.get_logger("supervisor").bind(backend=spec.name)
        self._state = S.STOPPED
        self._reason = "not started"
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()  # start / stop / restart, one at a time
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._spawned = asyncio.Event()  # the current run's first spawn attempt is over
        self._proc: ChildProcess | None = None
        self._port: int | None = None
        self._lines: tuple[str, ...] = ()
        self._exits: deque[float] = deque()  # monotonic times of unrequested exits
        self._spawns = 0
        self._crash_loops = 0
        self._health_failures = 0
        self._last_exit_code: int | None = None
        self._last_error: str | None = None
        self._started_at: float | None = None
        self._next_start_at: float | None = None
        self._draft_control: DraftControl | None = None
        self._draft_control_reason: str | None = None
        self._chat_template: ChatTemplateCheck | None = None

    # --- read-only view (supervisor.backend.Backend) ---
    @property
    def spec(self) -> BackendSpec:
        return self._spec

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def state(self) -> BackendState:
        return self._state

    @property
    def state_reason(self) -> str:
        return self._reason

    @property
    def base_url(self) -> str | None:
        if self._spec.url is not None:
            return self._spec.url.rstrip("/")
        return f"http://{HOST}:{self._port}" if self._port is not None else None

    @property
    def port(self) -> int | None:
        return urlsplit(self._spec.url).port if self._spec.url is not None else self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def restarts(self) -> int:
        return max(self._spawns - 1, 0)

    @property
    def crash_loops(self) -> int:
        return self._crash_loops

    @property
    def health_failures(self) -> int:
        return self._health_failures

    @property
    def last_exit_code(self) -> int | None:
        return self._last_exit_code

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def started_at(self) -> float | None:
        return self._started_at

    @property
    def uptime_s(self) -> float | None:
        return None if self._started_at is None else time.monotonic() - self._started_at

    @property
    def last_log_lines(self) -> tuple[str, ...]:
        return tuple(self._proc.lines) if self._proc is not None else self._lines

    @property
    def draft_control(self) -> DraftControl | None:
        return self._draft_control

    @property
    def draft_control_reason(self) -> str | None:
        return self._draft_control_reason

    @property
    def chat_template(self) -> ChatTemplateCheck | None:
        return self._chat_template

    def snapshot(self) -> dict[str, object]:
        uptime = self.uptime_s
        next_start = self._next_start_at
        return {
            "name": self.name,
            "model": self._spec.model,
            "profile": self._spec.profile,
            "state": str(self._state),
            "reason": None if self._reason is None else shown(self._reason),
            "url": None if self.base_url is None else shown(self.base_url),
            "remote": self._spec.is_remote,
            "pid": self.pid,
            "port": self.port,
            "restarts": self.restarts,
            "crash_loops": self._crash_loops,
            "health_failures": self._health_failures,
            "last_exit_code": self._last_exit_code,
            "last_error": None if self._last_error is None else shown(self._last_error),
            "uptime_s": None if uptime is None else round(uptime, 3),
            "started_at": None if uptime is None else round(time.time() - uptime, 3),
            "next_start_in_s": (
                None if next_start is None else round(max(next_start - time.monotonic(), 0), 3)
            ),
            "draft_control": self._draft_control,
            "draft_control_reason": self._draft_control_reason,
            "chat_template": None if self._chat_template is None else self._chat_template.as_json(),
            "cause": self._cause(),
        }

    def _cause(self) -> str | None:
        """The last failure's known cause in plain words (supervisor.causes), if any."""
        if self._last_error is None:
            return None
        cause = diagnose(self.last_log_lines, self._last_exit_code, self._last_error)
        return None if cause is None else cause.words

    # --- control (Supervisor only) ---
    async def start(self, session: aiohttp.ClientSession) -> None:
        """Begin supervising; returns once the first spawn attempt is over."""
        async with self._lock:
            self._session = session
            if self._task is None:
                self._begin("start")
        await self._spawned.wait()

    async def stop(self, reason: str = "stop requested") -> None:
        """Drain (in_flight -> 0), SIGTERM the group, SIGKILL after stop_timeout_s; STOPPED."""
        async with self._lock:
            await self._stop_locked(reason)

    async def restart(self, reason: str = "restart requested") -> None:
        """Stop if running, forget the crash history (leaves FAILED), start again."""
        async with self._lock:
            await self._stop_locked(reason)
            self._exits.clear()
            self._begin(reason)
        await self._spawned.wait()

    async def wait_for(self, states: Collection[BackendState], timeout_s: float | None) -> bool:
        """Wait until the state is one of states; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._state not in states:
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    # --- state machine ---
    def _set_state(self, new: BackendState, reason: str) -> None:
        old = self._state
        check_transition(self.name, old, new)
        self._state, self._reason = new, reason
        trouble = new in (S.UNHEALTHY, S.FAILED) or (new is S.STOPPED and old is not S.STOPPING)
        log = self._log.warning if trouble else self._log.info
        # The ready line says what the backend was found to do (the probe and the template check).
        found = self._found() if new is S.READY else {}
        log("state change", **{"from": str(old), "to": str(new)}, reason=reason, **found)
        # Wake waiters with the current event, then arm a fresh one for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
        if self._on_change is not None:
            try:
                self._on_change(self)
            except Exception:
                self._log.exception("on_change callback failed")

    def _found(self) -> dict[str, str | None]:
        check = self._chat_template
        late_system = None if check is None else check.late_system
        return {"draft_control": self._draft_control, "late_system": late_system}

    def _starting(self, reason: str) -> None:
        self._draft_control = self._draft_control_reason = None  # probed again once healthy
        self._chat_template = None  # ... and checked again
        self._set_state(S.STARTING, reason)

    async def _check_before_ready(self) -> None:
        """What the proxy needs to know before it sends a request: draft control and template."""
        await self._probe_draft_control()
        await self._check_chat_template()

    async def _check_chat_template(self) -> None:
        """Before READY: does its chat template take a late system message? (template_check)"""
        found = await check_chat_template(
            self._http(), self._url(), timeout_s=self._settings.probe_timeout_s
        )
        self._chat_template = found
        log = self._log.warning if found.reason.startswith("check failed") else self._log.info
        log(
            "template_checked",
            late_system=found.late_system,
            reason=found.reason,
            seconds=found.seconds,
        )

    async def _probe_draft_control(self) -> None:
        """Before READY: can a request set this backend's draft depth? (supervisor.draft_probe)"""
        spec = self._spec
        found = await probe_draft_control(
            self._http(),
            self._url(),
            model=spec.model,
            speculative=spec.is_remote or speculation_in(spec.argv),
            timeout_s=self._settings.probe_timeout_s,
        )
        self._draft_control, self._draft_control_reason = found.control, found.reason
        log = self._log.warning if found.failed else self._log.info
        log(
            "backend_probed",
            draft_control=found.control,
            reason=found.reason,
            seconds=found.seconds,
        )

    async def _run_before_ready(self) -> None:
        """The owner's hook, once healthy, probed and checked: nothing it does may fail it."""
        if self._before_ready is None:
            return
        try:
            await self._before_ready(self)
        except Exception:
            self._log.exception("before_ready hook failed")

    def _begin(self, reason: str) -> None:
        self._spawned.clear()
        self._next_start_at = None
        self._task = asyncio.create_task(self._run(reason), name=f"backend {self.name}")

    async def _run(self, reason: str) -> None:
        try:
            if self._spec.url is not None:
                self._starting(reason)
                self._started_at = time.monotonic()
                self._spawned.set()
                await self._watch(None)  # returns only for a process
                return
            while await self._run_process(reason):
                reason = "restart after backoff"
        except Exception as exc:  # a bug: make it visible instead of a silently dead task
            self._log.exception("supervision loop crashed")
            self._last_error = f"supervision loop crashed: {exc!r}"
            if self._proc is not None:
                await self._proc.kill()
                self._proc, self._started_at = None, None
            if S.FAILED in TRANSITIONS[self._state]:
                self._set_state(S.FAILED, self._last_error)
        finally:
            self._spawned.set()

    async def _run_process(self, reason: str) -> bool:
        """Spawn, wait until ready, watch; after an exit: True to start again (after backoff)."""
        self._starting(reason)
        ended = await self._spawn_and_watch()
        now = time.monotonic()
        self._exits.append(now)
        window = self._settings.crash_loop_window_s
        while self._exits and self._exits[0] < now - window:
            self._exits.popleft()
        if len(self._exits) > self._settings.crash_loop_count:
            self._crash_loops += 1
            self._set_state(
                S.FAILED,
                f"crash loop: {len(self._exits)} exits within {window:g}s, last: {ended}",
            )
            return False
        delay = min(
            self._settings.backoff_initial_s * 2 ** (len(self._exits) - 1),
            self._settings.backoff_max_s,
        )
        self._next_start_at = now + delay
        self._set_state(S.STOPPED, f"{ended}; restarting in {delay:.2f}s")
        await asyncio.sleep(delay)
        self._next_start_at = None
        return True

    async def _spawn_and_watch(self) -> str:
        """Run one process until it exits or is replaced; returns what happened."""
        self._port = free_loopback_port()
        argv = [*self._spec.argv, "--host", HOST, "--port", str(self._port)]
        self._spawns += 1
        try:
            proc = await ChildProcess.spawn(argv, os.environ | dict(self._spec.env), self._log)
        except OSError as exc:
            self._spawned.set()
            self._last_exit_code = None
            self._last_error = f"cannot start {argv[0]}: {exc}"
            self._log.error("spawn failed", argv=argv, error=str(exc))
            return self._last_error
        self._proc, self._started_at = proc, proc.started_at
        self._log.info("spawned", pid=proc.pid, port=self._port, argv=argv)
        self._spawned.set()
        # On cancellation (stop) the process stays in self._proc: stop() ends it.
        failure = await self._await_ready(proc)
        if failure is None:
            failure = await self._watch(proc)
        await proc.close()
        self._last_exit_code = proc.returncode
        self._lines = tuple(proc.lines)
        self._proc, self._started_at = None, None
        return failure

    async def _await_ready(self, proc: ChildProcess) -> str | None:
        """Poll /health until 200 (None) or the process exits or loading times out (reason)."""
        settings = self._settings
        deadline = proc.started_at + settings.ready_timeout_s
        while True:
            if proc.exited:
                return await self._ended(f"{describe_exit(proc.returncode)} before ready", proc)
            health = await check_health(self._http(), self._url(), settings.health_timeout_s)
            if health.ok and not proc.exited:
                loaded = time.monotonic() - proc.started_at
                await self._check_before_ready()
                await self._run_before_ready()
                if proc.exited:
                    continue  # died while probed or calibrated: reported at the top of the loop
                self._last_error = None
                self._set_state(S.READY, f"/health 200 after {loaded:.2f}s")
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await proc.terminate(settings.stop_timeout_s)
                return await self._ended(
                    f"not ready after {settings.ready_timeout_s:g}s (/health: {health.detail})",
                    proc,
                )
            await proc.wait(min(settings.ready_poll_s, remaining))

    async def _watch(self, proc: ChildProcess | None) -> str:
        """Periodic /health while serving. Returns when the process exits or was replaced."""
        settings = self._settings
        last_ok = time.monotonic()
        unhealthy_since = 0.0
        while True:
            began = time.monotonic()
            if proc is not None and proc.exited:
                return await self._ended(describe_exit(proc.returncode), proc)
            health = await check_health(self._http(), self._url(), settings.health_timeout_s)
            now = time.monotonic()
            if proc is not None and proc.exited:
                continue
            silent = now - last_ok
            if health.ok:
                # Silence counts from when this check was sent: checks keep a cadence from their
                # start, so counting from the answer would land every timeout just short of
                # unhealthy_after_s and detection would take one interval longer.
                last_ok = began
                if self._state is S.STARTING:  # a remote backend's first 200
                    await self._check_before_ready()
                    await self._run_before_ready()
                if self._state is not S.READY:
                    self._set_state(S.READY, "/health 200")
            else:
                self._health_failures += 1
                if self._state is not S.UNHEALTHY and silent >= settings.unhealthy_after_s:
                    unhealthy_since = now
                    self._set_state(
                        S.UNHEALTHY, f"no healthy /health for {silent:.1f}s: {health.detail}"
                    )
                elif (
                    proc is not None
                    and self._state is S.UNHEALTHY
                    and now - unhealthy_since >= settings.replace_after_s
                ):
                    # Hung (SIGSTOP, deadlock): SIGTERM would wait in vain; SIGKILL works.
                    await proc.kill()
                    return await self._ended(
                        f"killed: no healthy /health for {silent:.1f}s ({health.detail})", proc
                    )
            # Keep the cadence: a slow (timed-out) check already used part of the interval.
            pause = max(settings.health_interval_s - (time.monotonic() - began), 0.0)
            if proc is None:
                await asyncio.sleep(pause)
            else:
                await proc.wait(pause)

    async def _ended(self, what: str, proc: ChildProcess) -> str:
        """Record why the process ended, quoting its last output lines."""
        await proc.close()  # collect the output still in the pipes first
        tail = list(proc.lines)[-_ERROR_TAIL:]
        self._last_error = what + (
            "; last output:\n" + "\n".join(f"  {line}" for line in tail) if tail else ""
        )
        self._log.error(what, pid=proc.pid, last_lines=tail)
        return what

    async def _stop_locked(self, reason: str) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._next_start_at = None
        proc = self._proc
        if proc is None and self._state in (S.STOPPED, S.FAILED):
            return
        self._set_state(S.STOPPING, reason)
        if proc is not None:
            await self._drain(proc)
            await proc.terminate(self._settings.stop_timeout_s)
            self._last_exit_code = proc.returncode
            self._lines = tuple(proc.lines)
            self._log.info("stopped", pid=proc.pid, exit=describe_exit(proc.returncode))
        self._proc, self._started_at = None, None
        self._set_state(S.STOPPED, reason)

    async def _drain(self, proc: ChildProcess) -> None:
        """Let requests in flight finish (up to drain_timeout_s) before signalling."""
        if self._in_flight is None:
            return
        deadline = time.monotonic() + self._settings.drain_timeout_s
        while (busy := self._in_flight(self.name)) > 0 and not proc.exited:
            if time.monotonic() >= deadline:
                self._log.warning("drain timed out", in_flight=busy)
                return
            await proc.wait(_DRAIN_POLL_S)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"backend {self.name}: started without an HTTP session")
        return self._session

    def _url(self) -> str:
        url = self.base_url
        if url is None:
            raise RuntimeError(f"backend {self.name}: no port assigned")
        return url


def _is_backend(child: Child) -> Backend:
    return child  # mypy checks here that Child satisfies the Backend protocol

"""The supervisor: start, watch, reload and stop every backend of the configuration."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

import aiohttp
import structlog

from supervisor.backend import Backend, BeforeReady, InFlight, OnChange
from supervisor.child import Child
from supervisor.connections import backend_connector
from supervisor.settings import SupervisorSettings
from supervisor.spec import BackendSpec
from supervisor.states import BackendState

S = BackendState


class Supervisor:
    """Keeps the backends of `specs` running; tells `on_change` about every state change.

    Use: ``await start()``, ``await wait_ready(t)``, ..., ``await stop()`` (or ``async with``).
    """

    def __init__(
        self,
        specs: Iterable[BackendSpec],
        settings: SupervisorSettings,
        *,
        on_change: OnChange | None = None,
        in_flight: InFlight | None = None,
        before_ready: BeforeReady | None = None,
    ) -> None:
        self._settings = settings
        self._user_on_change = on_change
        self._in_flight = in_flight
        self._before_ready = before_ready
        self._log = structlog.get_logger("supervisor")
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()  # start / reload / stop, one at a time
        self._closing = asyncio.Event()  # stop() cuts a reload's wait for a replacement short
        self._session: aiohttp.ClientSession | None = None
        self._children = [self._child(spec) for spec in _unique(specs)]

    @property
    def backends(self) -> Sequence[Backend]:
        """Current backends in configuration order (a changed one twice while it is replaced)."""
        return tuple(self._children)

    def snapshot(self) -> list[dict[str, object]]:
        """JSON-ready state of every backend, for an admin endpoint."""
        return [child.snapshot() for child in self._children]

    def backend(self, name: str) -> Backend:
        """The backend to use under that name; KeyError if none.

        While a reload replaces a backend two exist under its name: this returns the old one
        until the new one is READY, then the new one. A proxy that keys backends by name
        should read this in its on_change callback rather than the backend it was passed.
        """
        same = [child for child in self._children if child.name == name]
        if not same:
            raise KeyError(f"no backend named {name!r}")
        ready = [child for child in same if child.state is S.READY]
        return (ready or same)[-1]

    async def start(self) -> None:
        """Spawn every backend, stagger_s apart; returns once all are spawned (not ready)."""
        async with self._lock:
            self._closing.clear()
            if self._session is None:
                # Health checks only: no connection limit to share with the proxy's traffic.
                self._session = aiohttp.ClientSession(
                    connector=backend_connector(), trust_env=False
                )
            await self._start_children(self._children)

    async def wait_ready(self, timeout: float, *, require_all: bool = True) -> bool:  # noqa: ASYNC109 - contract
        """True once every backend (or, with require_all=False, any) is READY.

        False on timeout, or at once when that can no longer happen without a restart (FAILED).
        """
        try:
            async with asyncio.timeout(timeout):
                while True:
                    changed = self._changed
                    verdict = self._ready_verdict(require_all)
                    if verdict is not None:
                        return verdict
                    await changed.wait()
        except TimeoutError:
            return False

    async def stop(self) -> None:
        """Stop every backend at once (drain, SIGTERM, SIGKILL) and close the HTTP session."""
        self._closing.set()
        async with self._lock:
            await asyncio.gather(*(child.stop("supervisor stopping") for child in self._children))
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def restart(self, name: str) -> None:
        """Restart one backend (also brings a FAILED one back); KeyError for an unknown name."""
        child = self._find(name)  # the newest under that name
        await child.restart()

    async def reload(self, specs: Iterable[BackendSpec]) -> None:
        """Apply a new configuration with as little disruption as possible.

        Unchanged backends keep running; removed ones are stopped; new ones started; a
        changed one is replaced start-first: the old one is drained and stopped only once the
        new process is READY; a successor that fails (or is not ready within ready_timeout_s)
        is dropped and the old one keeps serving, so a reload never takes a model down.
        Replacements go one at a time, which bounds the extra memory to one process.
        """
        wanted = _unique(specs)
        async with self._lock:
            current = {child.name: child for child in self._children}
            names = {spec.name for spec in wanted}
            removed = [child for child in self._children if child.name not in names]
            added = [self._child(spec) for spec in wanted if spec.name not in current]
            changed = [
                (current[spec.name], spec)
                for spec in wanted
                if spec.name in current and current[spec.name].spec != spec
            ]
            # A reload is also the operator's "try again" for backends that gave up.
            retry = [
                current[spec.name]
                for spec in wanted
                if spec.name in current
                and current[spec.name].spec == spec
                and current[spec.name].state is S.FAILED
            ]
            self._log.info(
                "reload",
                added=[c.name for c in added],
                removed=[c.name for c in removed],
                changed=[c.name for c, _ in changed],
                retried=[c.name for c in retry],
            )
            await asyncio.gather(*(child.stop("removed by reload") for child in removed))
            self._children = [c for c in self._children if c not in removed] + added
            if self._session is not None:
                await self._start_children(added)
                for child in retry:
                    await child.restart("retried by reload")
            for old, spec in changed:
                await self._replace(old, spec)
            order = {spec.name: i for i, spec in enumerate(wanted)}
            self._children.sort(key=lambda child: order[child.name])

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _replace(self, old: Child, spec: BackendSpec) -> None:
        """Start `spec` next to `old`; only a READY successor replaces it. One that fails or
        is not ready within ready_timeout_s is dropped and `old` keeps serving."""
        new = self._child(spec)
        if self._session is None:  # not started: nothing runs, start() will run the new spec
            self._children[self._children.index(old)] = new
            return
        self._children.insert(self._children.index(old) + 1, new)
        began = time.monotonic()
        await new.start(self._session)
        await self._settle(new)
        after_s = round(time.monotonic() - began, 3)
        if new.state is not S.READY:
            self._log.error(
                "replacement failed, old backend kept",
                backend=spec.name,
                state=str(new.state),
                reason=new.last_error or new.state_reason,
                after_s=after_s,
            )
            self._children.remove(new)
            await new.stop("replacement not ready: dropped, the old backend stays")
            return
        self._log.info("replacement ready", backend=spec.name, after_s=after_s)
        await old.stop("replaced by reload")
        self._children.remove(old)

    async def _settle(self, child: Child) -> bool:
        """Wait until child is READY or FAILED, up to ready_timeout_s or until stop()."""
        settled = asyncio.ensure_future(
            child.wait_for((S.READY, S.FAILED), self._settings.ready_timeout_s)
        )
        closing = asyncio.ensure_future(self._closing.wait())
        await asyncio.wait([settled, closing], return_when=asyncio.FIRST_COMPLETED)
        closing.cancel()
        settled.cancel()
        return settled.done() and not settled.cancelled() and settled.result()

    async def _start_children(self, children: Sequence[Child]) -> None:
        assert self._session is not None
        spawned_any = False
        for child in children:
            if self._closing.is_set():
                return  # stop() is waiting: spawning more would only delay it
            # Stagger local spawns so big models do not load (and fill memory) at once.
            if spawned_any and not child.spec.is_remote and self._settings.stagger_s > 0:
                await asyncio.sleep(self._settings.stagger_s)
            await child.start(self._session)
            spawned_any = spawned_any or not child.spec.is_remote

    def _ready_verdict(self, require_all: bool) -> bool | None:
        states = [child.state for child in self._children]
        if require_all:
            if all(state is S.READY for state in states):
                return True
            return False if any(state is S.FAILED for state in states) else None
        if any(state is S.READY for state in states):
            return True
        return False if states and all(state is S.FAILED for state in states) else None

    def _child(self, spec: BackendSpec) -> Child:
        return Child(
            spec,
            self._settings,
            on_change=self._on_change,
            in_flight=self._in_flight,
            before_ready=self._before_ready,
        )

    def _on_change(self, backend: Backend) -> None:
        # Wake wait_ready, then arm a fresh event for the next change.
        self._changed.set()
        self._changed = asyncio.Event()
        if self._user_on_change is not None:
            self._user_on_change(backend)

    def _find(self, name: str) -> Child:
        for child in reversed(self._children):
            if child.name == name:
                return child
        raise KeyError(f"no backend named {name!r}")


def _unique(specs: Iterable[BackendSpec]) -> list[BackendSpec]:
    result = list(specs)
    seen: set[str] = set()
    for spec in result:
        if spec.name in seen:
            raise ValueError(f"duplicate backend name {spec.name!r}")
        seen.add(spec.name)
    return result

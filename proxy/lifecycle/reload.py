"""SIGHUP: re-read the configuration file and apply its models to the running backends.

Only the models (and so the backends) change at a reload: unchanged backends keep running, new ones
start, removed ones drain and stop, and a changed one is replaced start-first, so a model never
loses its last ready backend (`Supervisor.reload`). A FAILED backend is given another try. The
listener, timeouts, supervisor timings and routing settings stay as the proxy started with them; a
reload that changes them says so in the log. Two things besides the models follow a reload, since
they go with the profiles: the routing roles (``profile_off``, ``profile_min``, ``profile_max`` name
profiles, which a reload may rename), and the learned file when another writer replaced
``routing.learned_file`` (``mtp-proxy tune --apply``; proxy.lifecycle.learned_file): it is loaded in
place of what the proxy had learned. A configuration that does not validate is logged and ignored:
the running backends stay as they are.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog

from proxy.config.settings import ConfigError, Settings, load_settings
from proxy.lifecycle import sdnotify
from proxy.plans.adopt import adopt_plans, apply_plans
from proxy.plans.learned_keys import learned_keys
from proxy.plans.plan import ModelPlan, backend_specs, plans_of
from proxy.routing.priors import adopt
from proxy.serving.model_names import ModelCatalog
from proxy.state import ProxyState
from supervisor.commandline import LlamaServerNotFoundError

log = structlog.get_logger("proxy.reload")

# Sections a reload does not apply (the server's host and port may come from the command line).
_FIXED_SECTIONS = ("server", "log", "supervisor", "routing")
_COMMAND_LINE_FIELDS = {"host", "port"}
# Routing fields a reload applies: the roles name profiles, and a reload changes the profiles.
ROLE_FIELDS = ("profile_off", "profile_min", "profile_max")


class Reloader:
    """Applies reloads one at a time; `request()` is the SIGHUP handler."""

    def __init__(self, state: ProxyState, config_path: Path | None) -> None:
        self._state = state
        self._path = config_path
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[bool]] = set()
        self._closed = False

    def request(self) -> None:
        """Schedule a reload (signal handlers must not block)."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self.reload(), name="config reload")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> bool:
        """Re-read the file and apply it; False when it was not applied (the reason is logged)."""
        async with self._lock:
            if self._closed:
                return False
            if self._path is None:
                log.warning("reload_skipped", reason="started without --config: nothing to re-read")
                return False
            loaded = await asyncio.to_thread(_load, self._path)
            if isinstance(loaded, str):
                log.error(
                    "reload_failed", path=str(self._path), error=loaded, kept="running backends"
                )
                return False
            try:
                await self._apply(loaded)
            except Exception:  # a bug: log it here, a signal-started task has no caller
                log.exception("reload_crashed", path=str(self._path))
                return False
            return True

    def close(self) -> None:
        """At shutdown: refuse further reloads (one under way ends when the supervisor stops)."""
        self._closed = True

    async def wait_closed(self) -> None:
        """Wait for reload tasks still running (call after the supervisor stopped)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _apply(self, settings: Settings) -> None:
        state = self._state
        supervisor = state.supervisor
        if supervisor is None:
            log.warning("reload_skipped", reason="the supervisor is not running")
            return
        _warn_fixed(state.settings, settings)
        sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        _adopt_roles(state, settings)
        await _adopt_learned_state(state, settings)
        _adopt_models(state, settings, carried_plans(state, settings))
        before, wanted = await adopt_plans(state)
        sdnotify.notify("READY=1")
        log.info(
            "reloaded",
            path=str(self._path),
            added=sorted(wanted.keys() - before.keys()),
            removed=sorted(before.keys() - wanted.keys()),
            changed=sorted(n for n, spec in wanted.items() if n in before and before[n] != spec),
            states={backend.name: str(backend.state) for backend in supervisor.backends},
        )


def carried_plans(state: ProxyState, settings: Settings) -> dict[str, ModelPlan]:
    """The plans after a reload: a model whose settings did not change keeps the plan it
    settled on (auto's probe is not run again, its fallback pool keeps running); any other
    model starts from its initial plan."""
    running = {model.name: model for model in state.settings.models}
    fresh = plans_of(settings)
    return {
        name: state.plans[name]
        if running.get(name) == model and name in state.plans
        else fresh[name]
        for model in settings.models
        if (name := model.name)
    }


def _adopt_roles(state: ProxyState, settings: Settings) -> None:
    """The routing roles of the new file (before the models: a renamed profile keeps its role)."""
    roles = {name: getattr(settings.routing, name) for name in ROLE_FIELDS}
    running = state.router.settings
    if all(getattr(running, name) == value for name, value in roles.items()):
        return
    routing = running.model_copy(update=roles)
    state.router.settings = routing
    state.settings = state.settings.model_copy(update={"routing": routing})
    log.info("routing_roles_reloaded", **roles)


async def _adopt_learned_state(state: ProxyState, settings: Settings) -> None:
    """Load routing.learned_file when another writer replaced it since the proxy's last save (an
    import's priors, tune's measurements), and hold the statistics to the keys of the new
    settings (another GGUF, binary or type: that model starts from priors)."""
    keys = await asyncio.to_thread(learned_keys, settings)
    learned_file = state.learned_file
    if learned_file is not None and await asyncio.to_thread(learned_file.replaced):
        state.bookkeeping.flush()  # what was still queued belongs to the statistics replaced
        stats = await asyncio.to_thread(learned_file.load, state.router.settings)
        adopt(stats, keys, settings.routing.prior_weight)
        state.router.stats = stats
        log.info("learned_file_reloaded", path=str(learned_file.path), report=stats.load_report)
        return
    adopt(state.router.stats, keys, settings.routing.prior_weight)


def _adopt_models(state: ProxyState, settings: Settings, plans: dict[str, ModelPlan]) -> None:
    """Before the backends change: with adopt_plans' registration (no await in between), a
    new model answers 503 (starting), not 404, while it loads; a removed one 404s at once
    while its requests in flight finish."""
    state.settings = state.settings.model_copy(
        update={"models": settings.models, "model_names": settings.model_names}
    )
    state.models = ModelCatalog(settings.models, settings.model_names)
    state.plans = plans
    apply_plans(state)
    state.metrics.prime({m.name: [p.name for p in m.profiles] for m in settings.models})


def _load(path: Path) -> Settings | str:
    """The new settings, or what is wrong with them (blocking: file reads, binary lookups)."""
    try:
        settings = load_settings(path)
        backend_specs(settings)  # every backend can be built (its binary found)
        return settings
    except ConfigError as exc:
        return "; ".join(exc.problems)
    except (OSError, ValueError, LlamaServerNotFoundError) as exc:
        return str(exc)


def _warn_fixed(running: Settings, new: Settings) -> None:
    changed = []
    for section in _FIXED_SECTIONS:
        exclude = {"server": _COMMAND_LINE_FIELDS, "routing": set(ROLE_FIELDS)}.get(section)
        old_value = getattr(running, section).model_dump(exclude=exclude)
        new_value = getattr(new, section).model_dump(exclude=exclude)
        if old_value != new_value:
            changed.append(section)
    if changed:
        log.warning("reload_partial", not_applied=changed, reason="these take a restart")

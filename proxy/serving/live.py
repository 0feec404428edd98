"""The read-only views behind the live page (/ui/) and `mtp-proxy status`: the depth each process
runs now and why, the recent requests, the chart of speed and acceptance per depth, and
whether drafting pays (proxy.serving.verdict).

Built when an admin endpoint is read (proxy.serving.admin), from objects that exist anyway: the live
backends (what decodes now), the router's busy epochs (proxy.routing.now) and the ring of
finished requests (proxy.observability.recent). Nothing here runs on a request's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.config.settings import Settings
from proxy.observability.depth_now import depth_now
from proxy.observability.recent import Finished, as_json
from proxy.observability.request_log import LOGGED, request_logger
from proxy.routing.now import BusyEpoch, busy_epochs
from proxy.serving.backends import LiveBackend
from proxy.serving.verdict import drafting_view
from proxy.state import STATE, ProxyState

MAX_ROWS = 1000
"""Finished requests one read returns at most (the page asks for what it has not seen)."""


def profile_depths(settings: Settings) -> dict[str, dict[str, int]]:
    """Model -> profile -> the draft depth that profile runs at (0: off)."""
    return {m.name: {p.name: m.profile_depth(p) for p in m.profiles} for m in settings.models}


def depths_view(state: ProxyState) -> dict[str, Any]:
    """Per backend: what decodes on it now, its busy epoch, its last request, and in one line
    the depth it runs now and why."""
    depth_of = profile_depths(state.settings)
    epochs = busy_epochs(state.router)
    backends = sorted(state.backends.all(), key=lambda b: b.name)
    state.recent.forget_backends({b.name for b in backends})  # those a reload removed
    rows = []
    for backend in backends:
        depths = depth_of.get(backend.model, {})
        last = state.recent.last_of_backend.get(backend.name)
        epoch = epochs.get(backend.name) if backend.slots > 1 else None  # one slot: never busy
        one_process = backend.model in state.router.per_request
        decoding = state.router.decoding(backend.name)
        depth, why = _now(backend, decoding, one_process, depths, epoch, last)
        rows.append(
            {
                "name": backend.name,
                "model": backend.model,
                "shape": "one-process" if one_process else "pool",
                "profile": None if one_process else backend.profile,
                "in_flight": backend.in_flight,
                "slots": backend.slots,
                "decoding": [
                    {"profile": p, "depth": depths.get(p), "requests": n}
                    for p, n in sorted(decoding.items())
                ],
                "busy": epoch.as_json() if epoch else None,
                "last": as_json(last, depth_of) if last else None,
                "depth": depth,
                "now": _shown(depth, backend, decoding),
                "why": why,
                "depth_now": _depth_now(backend, decoding, one_process, depths, last),
            }
        )
    levels = state.settings.routing.concurrency_levels
    return {"profiles": depth_of, "levels": levels, "backends": rows, "warnings": warnings(state)}


def warnings(state: ProxyState) -> list[str]:
    """What an operator must hear of the proxy as a whole, one line each: a learned file that
    was not read whole at the last load, the last save of the learned statistics failed."""
    learned_file = state.learned_file
    if learned_file is None:
        return []
    found = []
    report = state.router.stats.load_report
    if "untrusted" in report or report.startswith("unreadable"):
        found.append(f"the learned file {learned_file.path} was not read whole: {report}")
    if learned_file.save_failure is not None:
        found.append(
            f"the learned statistics could not be saved to {learned_file.path} (last try "
            f"{learned_file.save_failure}); what was learned since the last save is lost at a "
            "restart: make the file's directory writable, or set routing.learned_file"
        )
    return found


def _now(
    backend: LiveBackend,
    decoding: Mapping[str, int],
    one_process: bool,
    depths: dict[str, int],
    epoch: BusyEpoch | None,
    last: Finished | None,
) -> tuple[int | None, str]:
    """The depth the process runs now (None: idle, processing prompts only, or several depths
    at once) and why, in words."""
    if not one_process:
        return depths.get(backend.profile), f"pool: this process runs {backend.profile} only"
    if len(decoding) > 1:
        mix = ", ".join(f"{p} x{n}" for p, n in sorted(decoding.items()))
        return None, f"mixed depths decoding: {mix}"
    if decoding:
        ((profile, count),) = decoding.items()
        if epoch is not None and epoch.profile == profile and count >= 2:
            return depths.get(profile), _epoch_words(epoch, count)
        if last is not None and last.profile == profile and last.detail:
            return depths.get(profile), f"{count} decoding; last request: {last.detail}"
        return depths.get(profile), f"{count} decoding at {profile}"
    return None, _not_decoding(backend.in_flight, epoch)


def _depth_now(
    backend: LiveBackend,
    decoding: Mapping[str, int],
    one_process: bool,
    depths: dict[str, int],
    last: Finished | None,
) -> dict[str, Any] | None:
    """What the metric mtp_proxy_backend_depth says of it: the depth decoding now, else the last
    request's (proxy.observability.depth_now)."""
    now = depth_now(decoding, depths, last, None if one_process else backend.profile)
    if now is None:
        return None
    return {"depth": now.depth, "source": now.source, "profile": now.profile, "at": now.at}


def _shown(depth: int | None, backend: LiveBackend, decoding: Mapping[str, int]) -> str:
    """The depth now in one word, as the page and `status` show it."""
    if depth is not None:
        return str(depth)
    if decoding:
        return "mixed"
    return "prompt" if backend.in_flight else "idle"


def _not_decoding(in_flight: int, epoch: BusyEpoch | None) -> str:
    """Why no depth runs now: requests hold slots but none has decoded a token yet (a stream
    counts as decoding from its first), or the process is idle."""
    if in_flight:
        s = "" if in_flight == 1 else "s"
        return f"{in_flight} request{s} processing {'its' if in_flight == 1 else 'their'} prompt{s}"
    idle = "idle: the next request's depth is chosen for it"
    if epoch is not None:
        idle += f"; beside others it gets the busy epoch's {epoch.profile} (depth {epoch.depth})"
    return idle


def _epoch_words(epoch: BusyEpoch, count: int) -> str:
    exploring = " (exploring it)" if epoch.exploring else ""
    return (
        f"{count} requests decoding together at the busy epoch's depth{exploring}: every "
        f"request admitted beside others runs at {epoch.profile}"
    )


def requests_view(state: ProxyState, after: int, limit: int) -> dict[str, Any]:
    """The finished requests after sequence number ``after`` (the oldest first)."""
    depth_of = profile_depths(state.settings)
    rows = state.recent.after(after, min(limit, MAX_ROWS))
    return {
        "requests": [as_json(row, depth_of) for row in rows],
        "last": state.recent.last_seq,
        "capacity": state.recent.capacity,
    }


def chart_view(state: ProxyState) -> dict[str, Any]:
    """Decode tok/s and acceptance per (model, profile) over the chart's window, with depths."""
    chart = state.recent.chart()
    depth_of = profile_depths(state.settings)
    for line in chart["lines"]:
        line["depth"] = depth_of.get(line["model"], {}).get(line["profile"])
    return chart


def drafting(state: ProxyState) -> dict[str, Any]:
    """Does drafting pay: per process serving per-request depths, its start-up calibration's
    verdict per load level with the learned comparisons of that level beside it
    (proxy.serving.verdict)."""
    router = state.router
    models = {b.name: b.model for b in state.backends.all()}
    levels = state.settings.routing.concurrency_levels
    depths = profile_depths(state.settings)
    rows = drafting_view(router.calibrated, models, depths, router.stats.table(), levels)
    return {"backends": rows}


def quiet_read(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """A successful read of the live page (it polls every few seconds) is logged at debug, not
    info; a refused one keeps its info line (proxy.observability.access_log)."""
    if response.status < 400:
        request[LOGGED] = True
        state = request.app[STATE]
        status = response.status

        def record() -> None:
            request_logger(request, None).debug("request", status=status)

        state.bookkeeping.defer(record)
    return response

"""Admin endpoints: backends (state, speculative type, restarts, ...), restarting one, the
learned routing table, what the service runs (for `mtp-proxy tune --url`), and the live page's
reads: the depth each process runs now, recent requests, the depth chart, whether drafting pays.

Disabled (404) unless an admin key is configured; then every call must present it. Every
answer is strict JSON (``strict_json``): a number gone NaN or infinite is null.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import orjson
from aiohttp import web

from proxy.config.settings import ModelSettings
from proxy.plans.plan import ModelPlan, processes
from proxy.plans.speculation import SPECULATION_KEYS, backend_speculation
from proxy.serving import live
from proxy.serving.errors import error_response
from proxy.serving.expect import expect_handler
from proxy.serving.middlewares import header_bytes, key_matches, presented_key
from proxy.state import STATE, ProxyState
from supervisor.flags import CTX_SIZE, positive_int
from supervisor.spec import DraftSpec


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/backends", backends, expect_handler=expect_handler)
    app.router.add_post("/admin/backends/{name:.+}/restart", restart, expect_handler=expect_handler)
    app.router.add_get("/admin/routing", routing, expect_handler=expect_handler)
    app.router.add_get("/admin/service", service, expect_handler=expect_handler)
    app.router.add_get("/admin/depths", depths, expect_handler=expect_handler)
    app.router.add_get("/admin/requests", requests, expect_handler=expect_handler)
    app.router.add_get("/admin/chart", chart, expect_handler=expect_handler)
    app.router.add_get("/admin/drafting", drafting, expect_handler=expect_handler)


def strict_json(payload: object, status: int = 200) -> web.Response:
    """An admin answer as strict JSON (RFC 8259), the one way every admin route writes one:
    json.dumps wrote a learned or recent number gone non-finite as NaN or Infinity, which no
    browser's JSON.parse reads, and the live page failed every poll. orjson writes them null."""
    return web.Response(body=strict_dumps(payload), status=status, content_type="application/json")


def strict_dumps(value: object) -> bytes:
    """``value`` as strict JSON: non-finite numbers as null, keys that are not strings as text."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # what orjson does not write (an integer past 64 bits)
        return json.dumps(_finite(value), allow_nan=False, default=str).encode()


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _refusal(request: web.Request) -> web.Response | None:
    admin_key = request.app[STATE].settings.server.admin_key
    if admin_key is None:
        return error_response("openai", 404, "admin endpoints are disabled (no admin_key set)")
    admin_header = request.headers.get("X-Admin-Key")
    presented = header_bytes(admin_header) if admin_header else presented_key(request)
    if presented is None or not key_matches(presented, [admin_key.get_secret_value()]):
        return error_response("openai", 401, "invalid or missing admin key")
    return None


async def backends(request: web.Request) -> web.StreamResponse:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    rows = []
    supervised = {b.spec.name: b for b in state.supervisor.backends} if state.supervisor else {}
    drafting = backend_speculation(state.settings, state.plans)
    for backend in state.backends.all():
        row = supervised[backend.name].snapshot() if backend.name in supervised else {}
        row.update(name=backend.name, model=backend.model, profile=backend.profile)
        speculation = drafting.get(backend.name)  # None: a backend of no plan (being replaced)
        row.update(speculation.as_json() if speculation else dict.fromkeys(SPECULATION_KEYS))
        row.update(in_flight=backend.in_flight, slots=backend.slots)
        row.update(queued=state.admission.queued(backend.model))  # the model's, waiting
        check = row.get("chat_template")
        found = check.get("late_system") if isinstance(check, dict) else None
        row.update(late_system_words=late_system_words(found, state.settings.compat.system_turns))
        rows.append(row)
    return live.quiet_read(request, strict_json({"backends": rows}))


def late_system_words(found: object, system_turns: str) -> str:
    """What happens to a system message that is not first on a backend, in words: its chat
    template's answer (supervisor.template_check) and what the proxy does about it
    (``compat.system_turns``, proxy.compat.system_turns). A template that refuses them is no
    fault while the proxy mends them: the page shows it so, not as a failure."""
    mended = system_turns == "on" or (system_turns == "auto" and found == "refused")
    if found is None:
        return "late system messages: not checked yet"
    if mended:
        return "late system messages: mended"
    return {
        "in-place": "late system messages: kept in place",
        "hoisted": "late system messages: moved to the front",
        "refused": "late system messages: refused (compat.system_turns is off)",
    }.get(str(found), "late system messages: unknown (the template check could not tell)")


async def restart(request: web.Request) -> web.Response:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    name = request.match_info["name"]
    if state.supervisor is None or state.backends.get(name) is None:
        return error_response("openai", 404, f"no backend named {name!r}")
    await state.supervisor.restart(name)
    return strict_json({"restarting": name})


async def routing(request: web.Request) -> web.StreamResponse:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    state.bookkeeping.flush()  # what every request answered so far taught the router
    return live.quiet_read(request, strict_json(state.router.snapshot()))


async def depths(request: web.Request) -> web.StreamResponse:
    """Per backend, the depth it runs now and why (its busy epoch, its last request)."""
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    state.bookkeeping.flush()
    return live.quiet_read(request, strict_json(live.depths_view(state)))


async def requests(request: web.Request) -> web.StreamResponse:
    """Finished requests after ?after=SEQ (default: all kept), at most ?limit=N."""
    if refusal := _refusal(request):
        return refusal
    numbers = {}
    for name, default in (("after", 0), ("limit", live.MAX_ROWS)):
        text = request.query.get(name, str(default))
        if not text.isdigit() or len(text) > 18:
            message = f"{name} must be a non-negative integer, not {text[:40]!r}"
            return error_response("openai", 400, message)
        numbers[name] = int(text)
    state = request.app[STATE]
    state.bookkeeping.flush()  # the requests that just finished
    view = live.requests_view(state, numbers["after"], numbers["limit"])
    return live.quiet_read(request, strict_json(view))


async def chart(request: web.Request) -> web.StreamResponse:
    """Decode tok/s and acceptance per depth over the last minutes."""
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    state.bookkeeping.flush()
    return live.quiet_read(request, strict_json(live.chart_view(state)))


async def drafting(request: web.Request) -> web.StreamResponse:
    """Does drafting pay: each process's start-up calibration per load level, its verdict, and
    the learned comparisons of the same load beside it."""
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    state.bookkeeping.flush()
    return live.quiet_read(request, strict_json(live.drafting(state)))


async def service(request: web.Request) -> web.Response:
    """What this service runs, read-only: its process, config file and learned file in force
    (environment overrides applied), the routing settings it classifies with, and each model's
    plan with the draft settings of its processes. `mtp-proxy tune --url` measures through the
    service from this, and applies its result where the service reads it."""
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    routing = state.settings.routing
    return strict_json(
        {
            "pid": os.getpid(),
            "config_path": None if state.config_path is None else str(state.config_path),
            "learned_file": None if routing.learned_file is None else str(routing.learned_file),
            "state": state.router.stats.load_report,
            "state_loaded_at": None if state.learned_file is None else state.learned_file.loaded_at,
            "routing": routing.model_dump(mode="json"),
            "models": [_model_row(state, m) for m in state.settings.models],
        }
    )


def _model_row(state: ProxyState, model: ModelSettings) -> dict[str, Any]:
    plan: ModelPlan | None = state.plans.get(model.name)
    row: dict[str, Any] = {
        "name": model.name,
        "aliases": list(model.aliases),
        "backend": model.backend,
        "context": positive_int(model.args, CTX_SIZE),
        "draft_control": model.draft_control,
        "profiles": [
            {"name": p.name, "depth": model.profile_depth(p), **_draft(p.draft())}
            for p in model.profiles
        ],
        "backends": [b.name for b in state.backends.of_model(model.name)],
    }
    if plan is not None:
        row["plan"] = {
            "shape": plan.shape,
            "decided": plan.decided,
            "start_depth": plan.start_depth,
            "depths": dict(plan.depths),
            "single_profile": plan.single_profile,
            # The draft flags each process runs with (a per-request depth lowers n_max only).
            "processes": {p.name: _draft(p.profile.draft()) for p in processes(model, plan)},
        }
    return row


def _draft(draft: DraftSpec) -> dict[str, Any]:
    if draft.is_off:
        return {"spec_type": None, "n_max": None, "n_min": None, "p_min": None}
    return {
        "spec_type": draft.spec_type,
        "n_max": draft.n_max,
        "n_min": draft.n_min,
        "p_min": draft.p_min,
    }

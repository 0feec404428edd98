"""Admin endpoints: backends (state, restarts, ...), restarting one, and the learned routing table.

Disabled (404) unless an admin key is configured; then every call must present it.
"""

from __future__ import annotations

from aiohttp import web

from proxy.serving.errors import error_response
from proxy.serving.middlewares import key_matches, presented_key
from proxy.state import STATE


def add_routes(app: web.Application) -> None:
    app.router.add_get("/admin/backends", backends)
    app.router.add_post("/admin/backends/{name:.+}/restart", restart)
    app.router.add_get("/admin/routing", routing)


def _refusal(request: web.Request) -> web.Response | None:
    admin_key = request.app[STATE].settings.server.admin_key
    if admin_key is None:
        return error_response("openai", 404, "admin endpoints are disabled (no admin_key set)")
    presented = request.headers.get("X-Admin-Key") or presented_key(request)
    if presented is None or not key_matches(presented, [admin_key.get_secret_value()]):
        return error_response("openai", 401, "invalid or missing admin key")
    return None


async def backends(request: web.Request) -> web.Response:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    rows = []
    supervised = {b.spec.name: b for b in state.supervisor.backends} if state.supervisor else {}
    for backend in state.backends.all():
        row = supervised[backend.name].snapshot() if backend.name in supervised else {}
        row.update(name=backend.name, model=backend.model, profile=backend.profile)
        row.update(in_flight=backend.in_flight, slots=backend.slots)
        rows.append(row)
    return web.json_response({"backends": rows})


async def restart(request: web.Request) -> web.Response:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    name = request.match_info["name"]
    if state.supervisor is None or state.backends.get(name) is None:
        return error_response("openai", 404, f"no backend named {name!r}")
    await state.supervisor.restart(name)
    return web.json_response({"restarting": name})


async def routing(request: web.Request) -> web.Response:
    if refusal := _refusal(request):
        return refusal
    state = request.app[STATE]
    state.bookkeeping.flush()  # what every request answered so far taught the router
    return web.json_response(state.router.snapshot())

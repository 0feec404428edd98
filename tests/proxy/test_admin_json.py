"""Every admin route answers strict JSON (RFC 8259), whatever the state holds: a learned cell or
a recent request whose numbers went NaN or infinite reads as null, never as the NaN or Infinity
that a browser's JSON.parse refuses (the live page then failed every poll).

The proxy app runs in the test's own loop, on loopback, in front of a real backend process, so
that its state can be poisoned where no request could reach; the routes are read from the app's
route table, so a route added later is walked too.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.app import create_app
from proxy.config.settings import Settings
from proxy.observability.recent import Finished
from proxy.routing.classes import RequestClass
from proxy.routing.telemetry import Observation
from proxy.state import STATE
from tests.support.harness import ADMIN_KEY, proxy_config
from tests.support.misbehaving_backend import running_backend

MODEL = "echo"
BACKEND = "echo/off"
POISON = (math.nan, math.inf, -math.inf)


@pytest.fixture(scope="module")
def backend_url() -> Iterator[str]:
    with running_backend("ok") as url:
        yield url


@pytest.fixture
async def app_url(backend_url: str) -> AsyncIterator[tuple[web.Application, str]]:
    model = {
        "name": MODEL,
        "backend": "simulator",
        "profiles": [{"name": "off", "url": backend_url}],
    }
    app = create_app(Settings(**proxy_config([model])), registry=CollectorRegistry())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def poison(app: web.Application) -> None:
    """A learned cell and recent requests whose numbers are not finite, as a backend's absurd
    timings or a broken sum would leave them."""
    state = app[STATE]
    cls = RequestClass("<4k", "prose")
    for value in POISON:
        observation = Observation(
            BACKEND, "off", cls, 100, 0, 64, 10, 5, value, value, value, value, "timings"
        )
        state.router.stats.observe(cls, "off", observation, model=MODEL)
        seq = state.recent.last_seq + 1
        state.recent.add(
            Finished(
                seq, time.time(), f"poisoned-{seq}", "chat", MODEL, 200, value,
                backend=BACKEND, profile="off", request_class=cls.label,
                drafted=10, accepted=5, decode_tok_s=value, ttft_s=value,
            )
        )  # fmt: skip


def admin_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path) of every /admin route of the app, each {parameter} filled in."""
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = str(info.get("path") or info.get("formatter"))
        if path.startswith("/admin/") and route.method != "HEAD":
            routes.add((route.method, re.sub(r"\{[^}]*\}", BACKEND, path)))
    return sorted(routes)


def refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


async def test_every_admin_route_answers_strict_json_from_a_poisoned_state(
    app_url: tuple[web.Application, str],
) -> None:
    app, url = app_url
    poison(app)
    routes = admin_routes(app)
    assert ("GET", "/admin/requests") in routes and len(routes) >= 7, routes
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    answers: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:
        for method, path in routes:
            async with session.request(method, url + path, headers=headers) as response:
                text = await response.text()
                assert response.status == 200, (method, path, response.status, text)
            answers[path] = json.loads(text, parse_constant=refuse)
    poisoned = [
        r for r in answers["/admin/requests"]["requests"] if r["request_id"][:8] == "poisoned"
    ]
    assert [(r["duration_s"], r["decode_tok_s"], r["ttft_s"]) for r in poisoned] == [
        (None, None, None)
    ] * len(POISON)
    (cell,) = [row for row in answers["/admin/routing"]["learned"] if row["model"] == MODEL]
    assert cell["decode_tok_s"] is None and cell["samples"] == len(POISON)
    (line,) = answers["/admin/chart"]["lines"]
    assert line["points"][-1]["decode_tok_s"] is None
    (row,) = answers["/admin/depths"]["backends"]
    assert row["last"]["decode_tok_s"] is None

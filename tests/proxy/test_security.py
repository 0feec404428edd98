"""Security: client keys, the admin key, credentials kept from backends, redacted logs, loopback
binding and no CORS, on real proxy processes.

`locked` has client keys and an admin key and does not forward client credentials; `open_proxy`
has neither key, forwards credentials, and names no listen address (the default must be loopback).
Both serve `echo`, a remote backend (tests/support/misbehaving_backend.py) that answers with the
headers it received, and `open_proxy` also a simulated `mtp-demo`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from prometheus_client import CollectorRegistry

from proxy.app import create_app
from proxy.config.settings import ServerSettings, Settings, load_settings
from tests.support import rawhttp
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.misbehaving_backend import running_backend

CLIENT_KEYS = ["sk-client-alpha-0123456789", "sk-client-beta-9876543210"]
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_backend("echo-headers") as url:
        # By host name: aiohttp's default cookie jar ignores cookies from bare IP addresses.
        yield url.replace("127.0.0.1", "localhost")


def echo_model(url: str) -> dict[str, Any]:
    return {"name": "echo", "backend": "simulator", "profiles": [{"name": "off", "url": url}]}


def locked_config(echo_url: str) -> dict[str, Any]:
    config = proxy_config(
        [simulator_model(), echo_model(echo_url)], server={"api_keys": CLIENT_KEYS}
    )
    config["log"]["level"] = "debug"  # the most a log ever says: still no secret in it
    return config


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory, echo_url: str) -> Iterator[ProxyProcess]:
    with running_proxy(locked_config(echo_url), tmp_path_factory.mktemp("locked")) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def open_proxy(tmp_path_factory: pytest.TempPathFactory, echo_url: str) -> Iterator[ProxyProcess]:
    config = proxy_config([simulator_model(), echo_model(echo_url)])
    config["server"] = {"port": 0, "forward_client_auth": True}  # no host, no admin key
    with running_proxy(config, tmp_path_factory.mktemp("open")) as proxy:
        # /health is 200 from the first ready backend on; the tests look at every one.
        wait_all_ready(proxy, {"mtp-demo": 3, "echo": 1})
        yield proxy


async def post(
    proxy: ProxyProcess, path: str, headers: dict[str, str], model: str = "mtp-demo"
) -> tuple[int, Any]:
    body = {"model": model, "messages": CHAT, "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + path, json=body, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


# --- client keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-client-alpha-012345678"},  # one character short
        {"Authorization": "Bearer sk-client-alpha-0123456789x"},
        {"x-api-key": "wrong"},
        {"Authorization": "Basic " + CLIENT_KEYS[0]},
        {"Authorization": f"Bearer {ADMIN_KEY}"},  # the admin key is not a client key
    ],
)
async def test_missing_or_wrong_client_key_is_401_in_the_api_shape(
    locked: ProxyProcess, headers: dict[str, str]
) -> None:
    status, error = await post(locked, "/v1/chat/completions", headers)
    assert status == 401
    assert error["error"]["type"] == "authentication_error" and error["error"]["message"]
    status, error = await post(locked, "/v1/messages", headers)
    assert status == 401
    assert error["type"] == "error" and error["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {CLIENT_KEYS[0]}"},
        {"Authorization": f"bearer {CLIENT_KEYS[1]}"},
        {"x-api-key": CLIENT_KEYS[1]},
    ],
)
async def test_a_configured_key_in_either_header_is_accepted(
    locked: ProxyProcess, headers: dict[str, str]
) -> None:
    status, answer = await post(locked, "/v1/chat/completions", headers)
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"]


async def test_official_sdks_authenticate_with_their_own_headers(locked: ProxyProcess) -> None:
    oai = openai.AsyncOpenAI(base_url=locked.url + "/v1", api_key=CLIENT_KEYS[0])  # Bearer
    completion = await oai.chat.completions.create(model="mtp-demo", messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    assert completion.choices[0].message.content
    await oai.close()
    ant = anthropic.AsyncAnthropic(base_url=locked.url, api_key=CLIENT_KEYS[1])  # x-api-key
    message = await ant.messages.create(model="mtp-demo", max_tokens=4, messages=CHAT)  # type: ignore[arg-type]
    assert message.content
    wrong = anthropic.AsyncAnthropic(base_url=locked.url, api_key="sk-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await wrong.messages.create(model="mtp-demo", max_tokens=4, messages=CHAT)  # type: ignore[arg-type]
    await ant.close()
    await wrong.close()


async def test_models_need_a_key_but_health_checks_do_not(locked: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(locked.url + "/v1/models") as response:
            assert response.status == 401
        headers = {"Authorization": f"Bearer {CLIENT_KEYS[0]}"}
        async with session.get(locked.url + "/v1/models", headers=headers) as response:
            assert response.status == 200
        for path in ("/health", "/metrics"):
            async with session.get(locked.url + path) as response:
                assert response.status == 200


# What the docs leave open without a key: the health checks, /metrics and the live page's files
# (docs/api.md). Written out, not read from the middleware: a route added there would pass.
OPEN_WITHOUT_KEY = frozenset({"/health", "/v1/health", "/metrics", "/ui"})


def served_routes(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, path) of every route in the proxy's route table, built as `serve` builds it
    (nothing is started), each {parameter} filled in: a route added later is walked too."""
    app = create_app(Settings(**config), registry=CollectorRegistry())
    served = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = str(info.get("path") or info.get("formatter"))
        method = "POST" if route.method == "*" else route.method
        served.add((method, re.sub(r"\{[^}]*\}", "0", path)))
    return sorted(served)


async def test_every_route_checks_the_client_key(locked: ProxyProcess, echo_url: str) -> None:
    """Without a key, every route but the open ones (health checks, /metrics, the live page's
    files) is 401, the admin ones included; with a client key no route is 401 except the admin
    ones (it is not the admin key)."""
    routes = served_routes(locked_config(echo_url))
    assert len(routes) > 40 and ("GET", "/admin/backends") in routes
    keyed = {"Authorization": f"Bearer {CLIENT_KEYS[0]}"}
    async with aiohttp.ClientSession() as session:
        for method, path in routes:
            admin = path.startswith("/admin/")
            is_open = path in OPEN_WITHOUT_KEY or path.startswith("/ui/")
            for headers, expected_401 in (({}, not is_open), (keyed, admin)):
                async with session.request(
                    method, locked.url + path, json={"model": "echo"}, headers=headers
                ) as response:
                    got = response.status
                assert (got == 401) is expected_401, (method, path, headers, got)


# Keys that are not UTF-8: aiohttp hands such header bytes over as surrogate escapes, which the
# key check once failed to encode (500 and a traceback on every keyed and admin route).
NOT_UTF8 = b"\xff\xfe"
KEY_HEADERS = [b"Authorization: Bearer " + NOT_UTF8, b"x-api-key: " + NOT_UTF8]


def raw_exchange(port: int, method: str, path: str, header: bytes) -> tuple[int | None, Any]:
    body = json.dumps({"model": "echo", "messages": CHAT, "max_tokens": 4}).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with rawhttp.connect(port) as sock:
        sock.sendall(head.encode() + header + b"\r\n\r\n" + body)
        data, _, _ = rawhttp.read_until_closed(sock)
    return rawhttp.final_status(data), rawhttp.json_body(data)


@pytest.mark.parametrize("header", KEY_HEADERS, ids=["bearer", "x-api-key"])
def test_a_client_key_that_is_not_utf8_is_401_in_the_api_shape(
    locked: ProxyProcess, header: bytes
) -> None:
    for path, dialect in (
        ("/v1/chat/completions", "openai"),
        ("/v1/messages", "anthropic"),
        ("/v1/models", "openai"),
        ("/tokenize", "openai"),
    ):
        method = "GET" if path == "/v1/models" else "POST"
        status, error = raw_exchange(locked.port, method, path, header)
        assert status == 401, (path, status, error)
        if dialect == "anthropic":
            assert error["type"] == "error" and error["error"]["type"] == "authentication_error"
        else:
            assert error["error"]["type"] == "authentication_error", (path, error)
    assert "unhandled_error" not in [line.get("event") for line in locked.log_lines()]


@pytest.mark.parametrize(
    "header", [*KEY_HEADERS, b"X-Admin-Key: " + NOT_UTF8], ids=["bearer", "x-api-key", "admin"]
)
def test_an_admin_key_that_is_not_utf8_is_401(locked: ProxyProcess, header: bytes) -> None:
    for method, path in (("GET", "/admin/backends"), ("POST", "/admin/backends/echo/off/restart")):
        status, error = raw_exchange(locked.port, method, path, header)
        assert status == 401 and error["error"]["message"] == "invalid or missing admin key"
    assert "unhandled_error" not in [line.get("event") for line in locked.log_lines()]


# --- admin -------------------------------------------------------------------------------------


async def test_admin_needs_the_admin_key_not_a_client_key(locked: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        for headers, expected in (
            ({}, 401),
            ({"Authorization": f"Bearer {CLIENT_KEYS[0]}"}, 401),
            ({"x-api-key": CLIENT_KEYS[1]}, 401),
            ({"X-Admin-Key": ADMIN_KEY + "x"}, 401),
            ({"Authorization": f"Bearer {ADMIN_KEY}"}, 200),
            ({"X-Admin-Key": ADMIN_KEY}, 200),
        ):
            async with session.get(locked.url + "/admin/backends", headers=headers) as response:
                assert response.status == expected, headers
                body = await response.json()
            if expected == 401:
                assert body["error"]["message"]
            else:
                assert {b["name"] for b in body["backends"]} >= {"mtp-demo/off", "echo/off"}


async def test_admin_is_disabled_without_an_admin_key(open_proxy: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        for method, path in (
            ("GET", "/admin/backends"),
            ("GET", "/admin/routing"),
            ("GET", "/admin/depths"),
            ("GET", "/admin/requests"),
            ("GET", "/admin/chart"),
            ("GET", "/admin/drafting"),
            ("POST", "/admin/backends/mtp-demo/off/restart"),
        ):
            async with session.request(
                method, open_proxy.url + path, headers={"Authorization": "Bearer anything"}
            ) as response:
                assert response.status == 404
                assert (await response.json())["error"]["message"]


# --- credentials and backends ------------------------------------------------------------------


async def echoed_headers(proxy: ProxyProcess, headers: dict[str, str]) -> dict[str, str]:
    status, answer = await post(proxy, "/v1/chat/completions", headers, model="echo")
    assert status == 200, answer
    received: dict[str, str] = json.loads(answer["choices"][0]["message"]["content"])
    return {key.lower(): value for key, value in received.items()}


async def test_client_credentials_are_not_forwarded_by_default(locked: ProxyProcess) -> None:
    headers = {
        "Authorization": f"Bearer {CLIENT_KEYS[0]}",
        "x-api-key": CLIENT_KEYS[1],
        "Proxy-Authorization": "Basic c2VjcmV0",
        "X-Trace": "kept",
    }
    received = await echoed_headers(locked, headers)
    assert received["x-trace"] == "kept"  # end-to-end headers do go through
    assert "authorization" not in received
    assert "x-api-key" not in received
    assert "proxy-authorization" not in received


async def test_a_cookie_a_backend_set_is_not_replayed_on_later_requests(
    locked: ProxyProcess,
) -> None:
    headers = {"Authorization": f"Bearer {CLIENT_KEYS[0]}"}
    await echoed_headers(locked, headers)  # the backend answers with Set-Cookie
    received = await echoed_headers(locked, headers)
    assert "cookie" not in received


async def test_client_credentials_are_forwarded_when_configured(open_proxy: ProxyProcess) -> None:
    headers = {"Authorization": "Bearer sk-for-the-backend", "x-api-key": "sk-anthropic-style"}
    received = await echoed_headers(open_proxy, headers)
    assert received["authorization"] == "Bearer sk-for-the-backend"
    assert received["x-api-key"] == "sk-anthropic-style"


def test_spawned_backends_listen_on_loopback_only(open_proxy: ProxyProcess) -> None:
    rows = open_proxy.get_json("/admin/backends")  # disabled here: read the pids from /proc
    assert rows[0] == 404
    children = child_pids(open_proxy.process.pid)
    assert children, "no backend processes found"
    for pid in children:
        addresses = listening_addresses(pid)
        assert addresses, f"backend {pid} listens nowhere"
        assert all(address.startswith("127.") for address in addresses), addresses


def test_the_proxy_listens_on_loopback_by_default(open_proxy: ProxyProcess) -> None:
    assert ServerSettings().host == "127.0.0.1"
    assert load_settings(None).server.host == "127.0.0.1"  # the embedded default config
    assert listening_addresses(open_proxy.process.pid) == ["127.0.0.1"]


def child_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of the TCP sockets `pid` listens on (from /proc, IPv4 and IPv6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(_address(fields[1].split(":")[0]))
    return sorted(set(addresses))


def _address(hex_ip: str) -> str:
    if len(hex_ip) == 8:
        return ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return "::" if set(hex_ip) == {"0"} else f"ipv6:{hex_ip}"


# --- logs and CORS -----------------------------------------------------------------------------


async def test_secrets_never_reach_the_logs(locked: ProxyProcess, tmp_path: Path) -> None:
    await post(locked, "/v1/chat/completions", {"Authorization": f"Bearer {CLIENT_KEYS[0]}"})
    await post(locked, "/v1/messages", {"x-api-key": CLIENT_KEYS[1]})
    await post(locked, "/v1/chat/completions", {"Authorization": "Bearer sk-wrong-guess-777"})
    locked.get_json("/admin/backends", admin_key=ADMIN_KEY)
    locked.get_json("/admin/backends", admin_key="not-the-admin-key-555")
    log = locked.log_path.read_text()
    for secret in [*CLIENT_KEYS, ADMIN_KEY, "sk-wrong-guess-777", "not-the-admin-key-555"]:
        assert secret not in log, f"{secret!r} appears in the proxy log"
    events = [line.get("event") for line in locked.log_lines()]
    assert events.count("request") >= 3  # the requests were logged, just without secrets
    config = tmp_path / "config.toml"
    config.write_text(
        "[server]\napi_keys = ['sk-client-alpha-0123456789']\nadmin_key = 'adm-secret-42'\n"
        "[[models]]\nname = 'm'\nbackend = 'simulator'\n[[models.profiles]]\nname = 'off'\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "sk-client-alpha" not in checked.stdout + checked.stderr
    assert "adm-secret-42" not in checked.stdout + checked.stderr


async def test_cors_is_off_by_default(locked: ProxyProcess) -> None:
    origin = {"Origin": "http://evil.example"}
    async with aiohttp.ClientSession() as session:
        preflight = {**origin, "Access-Control-Request-Method": "POST"}
        async with session.options(
            locked.url + "/v1/chat/completions", headers=preflight
        ) as response:
            assert response.status >= 400  # no preflight approval
            assert not any(h.lower().startswith("access-control-") for h in response.headers)
        headers = {**origin, "Authorization": f"Bearer {CLIENT_KEYS[0]}"}
        async with session.get(locked.url + "/v1/models", headers=headers) as response:
            assert response.status == 200
            assert "Access-Control-Allow-Origin" not in response.headers

"""The connect timeout, on real sockets: a backend whose port stops completing TCP handshakes.

Loopback never loses a SYN, but a listener whose accept queue is full ignores new ones, so a
connect to it hangs exactly like one to a host that went away. The backend `hole` starts as a
working remote backend (tests/support/misbehaving_backend.py) so the proxy counts it ready; the
test then kills it and puts such a listener on its port, and sends a request pinned to it before
the health checks notice (they need seconds, `unhealthy_after_s`).
"""

from __future__ import annotations

import select
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from proxy.serving.forward import Timeouts, UpstreamUnavailable, open_upstream, upstream_url
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.misbehaving_backend import backend_process

CONNECT_S = 0.5
CHAT = [{"role": "user", "content": "Say hello."}]


@contextmanager
def unanswered_port(port: int) -> Iterator[None]:
    """Listen on `port` (loopback) with a full accept queue: further connects hang in SYN_SENT."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(0)
        fillers = []
        for _ in range(4):  # queue what it takes; the handshakes past that are ignored
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        # listen(0) queues one: once a filler's handshake is done, the queue is full
        _, connected, _ = select.select([], fillers, [], 10.0)
        assert connected, "no handshake completed"
        yield


def hole_health_failures(proxy: ProxyProcess) -> int:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return int(next(r["health_failures"] for r in rows if r["name"] == "mtp-demo/hole"))


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_open_upstream_gives_up_at_the_connect_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeouts = Timeouts(connect_s=CONNECT_S, first_byte_s=30.0, idle_s=30.0)
    with unanswered_port(port):
        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            with pytest.raises(UpstreamUnavailable, match=r"(?i)timeout"):
                url = upstream_url(f"http://127.0.0.1:{port}", "/v1/chat/completions")
                await open_upstream(session, url, b"{}", CIMultiDict(), timeouts)
            took = time.perf_counter() - started
    assert CONNECT_S * 0.8 < took < CONNECT_S + 5.0  # at the connect timeout, not the 30 s


def config(hole_url: str) -> dict[str, Any]:
    demo = simulator_model(slots=4, profiles=[{"name": "off"}, {"name": "hole", "url": hole_url}])
    return proxy_config([demo], server={"connect_timeout_s": CONNECT_S})


async def test_a_backend_that_stops_accepting_is_retried_after_the_connect_timeout(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with ExitStack() as stack:
        hole_url, hole = stack.enter_context(backend_process("ok", "--chunks", "2"))
        workdir = tmp_path_factory.mktemp("connect")
        proxy = stack.enter_context(running_proxy(config(hole_url), workdir))
        wait_all_ready(proxy, {"mtp-demo": 2})
        hole.send_signal(signal.SIGKILL)
        hole.wait()
        stack.enter_context(unanswered_port(port_of(hole_url)))
        # Once a health check of `hole` failed, the proxy has long seen its pooled connections
        # to the killed process close (an event, where a 0.2 s pause was a guess).
        failures = hole_health_failures(proxy)
        deadline = time.monotonic() + 30
        while hole_health_failures(proxy) == failures:
            assert time.monotonic() < deadline, "the hole's health check never failed"
            time.sleep(0.05)
        body = {"model": "mtp-demo", "messages": CHAT, "max_tokens": 8}
        started = time.perf_counter()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                proxy.url + "/v1/chat/completions", json=body, headers={"X-MTP-Profile": "hole"}
            ) as response,
        ):
            answer = await response.json()
        took = time.perf_counter() - started
        failures = [
            line
            for line in proxy.log_lines()
            if (line.get("event"), line.get("backend")) == ("upstream_unavailable", "mtp-demo/hole")
        ]
    assert response.status == 200, answer
    assert response.headers["X-MTP-Backend"] == "mtp-demo/off"
    assert answer["choices"][0]["message"]["content"]
    assert CONNECT_S * 0.8 < took < CONNECT_S + 3.0  # one connect timeout, then the retry
    assert failures and "timeout" in failures[0]["error"].lower(), failures

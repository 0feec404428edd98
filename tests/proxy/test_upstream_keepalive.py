"""The proxy never sends a request on a pooled connection the backend may have closed.

llama-server closes a keep-alive connection idle 5 s (its answers say `Keep-Alive: timeout=5`;
tests/llama/test_keepalive_llama.py measures it; supervisor.connections). A request sent on such a
connection just as the server closes it is lost before the first byte (aiohttp:
ServerDisconnectedError). On a model of one process that failure waits for a restart that never
comes (the process is healthy), and the request is refused after the queue timeout: seen in the
suite under load. The backend here makes the race's outcome certain: any request on a connection
idle 5 s or more is dropped.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from supervisor.connections import LLAMA_SERVER_KEEPALIVE_S, POOLED_KEEPALIVE_S
from tests.support.harness import proxy_config, running_proxy, simulator_model, wait_all_ready
from tests.support.misbehaving_backend import running_backend

CHAT = {"model": "mtp-demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def test_a_connection_idle_as_long_as_the_server_keeps_it_is_not_reused(
    tmp_path: Path,
) -> None:
    with running_backend("ok", "--drop-idle-s", str(LLAMA_SERVER_KEEPALIVE_S)) as url:
        model = simulator_model(slots=1, profiles=[{"name": "remote", "url": url}])
        with running_proxy(proxy_config([model]), tmp_path) as proxy:
            wait_all_ready(proxy, {"mtp-demo": 1})
            statuses = []
            async with aiohttp.ClientSession() as session:
                for pause in (0.0, LLAMA_SERVER_KEEPALIVE_S + 0.5):
                    time.sleep(pause)  # the proxy's pooled connection sits idle meanwhile
                    async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                        statuses.append((r.status, await r.text()))
    assert [status for status, _ in statuses] == [200, 200], statuses


async def test_a_request_dropped_on_a_connection_the_server_closed_is_sent_again_at_once(
    tmp_path: Path,
) -> None:
    """An event loop running late can still take a pooled connection for fresh after the
    server closed it: here the backend drops any request on a connection idle 1 s, well within
    the pool's own keep-alive, so the second request is sent on it and lost before a byte. It
    is sent once more on a new connection at once: answered, with no retry counted (a retry
    waited seconds for the healthy process to be rechecked)."""
    assert POOLED_KEEPALIVE_S > 1.5
    with running_backend("ok", "--drop-idle-s", "1") as url:
        model = simulator_model(slots=1, profiles=[{"name": "remote", "url": url}])
        with running_proxy(proxy_config([model]), tmp_path) as proxy:
            wait_all_ready(proxy, {"mtp-demo": 1})
            statuses = []
            async with aiohttp.ClientSession() as session:
                for pause in (0.0, 1.5):
                    time.sleep(pause)  # the proxy's pooled connection sits idle meanwhile
                    async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                        statuses.append((r.status, await r.text()))
                async with session.get(proxy.url + "/metrics") as r:
                    exposition = await r.text()
    assert [status for status, _ in statuses] == [200, 200], statuses
    retries = [
        line
        for line in exposition.splitlines()
        if line.startswith("mtp_proxy_upstream_retries_total")
    ]
    assert all(line.endswith(" 0.0") for line in retries), retries

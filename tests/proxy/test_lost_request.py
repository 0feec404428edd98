"""A request lost before its first byte on a model's one process, which stays healthy.

The simulator's fault (POST /sim/drop) closes a request's connection before any answer while
/health answers as ever: the keep-alive race (tests/proxy/test_upstream_keepalive.py) or any
request the process lost on its own. The proxy used to wait for the process to come back (a new
generation), which a healthy process never does, and refused the request at the queue timeout
as if there were no capacity. Now it sends the request again once the supervisor would have
taken the process out of service had it stopped answering (proxy.serving.exchange), and says
502 when every attempt is lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)

MODEL = "mtp-demo"
BACKEND = "mtp-demo/one-process"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
# A process that stopped answering /health would be out of service within ~1.7 s here.
SUPERVISOR = {"health_interval_s": 0.2, "health_timeout_s": 0.5, "unhealthy_after_s": 1.0}
QUEUE_TIMEOUT_S = 20.0  # far past the recheck: a request still waiting then is refused (429)
ATTEMPTS = 3  # server.retry_before_first_byte's default (2), plus the first
SENDS = 2  # each attempt: the request, and once more at once on a new connection (forward.py)


def one_process_proxy(tmp_path: Path) -> Any:
    model = simulator_model(draft_control="per-request")
    config = proxy_config(
        [model],
        server={"queue_timeout_s": QUEUE_TIMEOUT_S},
        supervisor=SUPERVISOR,
        routing={"calibrate": "off"},
    )
    return running_proxy(config, tmp_path)


async def drop(session: aiohttp.ClientSession, proxy: ProxyProcess, requests: int) -> None:
    _, backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    url = next(b["url"] for b in backends["backends"] if b["name"] == BACKEND)
    async with session.post(url + "/sim/drop", json={"requests": requests}) as r:
        assert r.status == 200, await r.text()


def lost(proxy: ProxyProcess) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == "upstream_unavailable"]


async def test_a_request_lost_on_a_healthy_process_is_sent_again(tmp_path: Path) -> None:
    with one_process_proxy(tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        async with aiohttp.ClientSession() as session:
            await drop(session, proxy, SENDS)  # both sends of the first attempt
            async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                status, answer = r.status, await r.json()
        (line,) = lost(proxy)
        _, health = proxy.get_json("/health")
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"]
    assert line["backend"] == BACKEND
    assert line["recheck_s"] == 1.7  # unhealthy_after_s + health_interval_s + health_timeout_s
    assert health["ready_backends"] == {MODEL: 1}  # the process was never restarted


async def test_a_request_lost_on_every_attempt_is_a_502_in_the_apis_shape(tmp_path: Path) -> None:
    with one_process_proxy(tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        async with aiohttp.ClientSession() as session:
            await drop(session, proxy, ATTEMPTS * SENDS)
            async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                status, answer = r.status, await r.json()
            async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                after = r.status  # the process serves the next request as ever
        attempts = len(lost(proxy))
    assert status == 502, answer
    assert "failed before answering" in answer["error"]["message"]
    assert attempts == ATTEMPTS
    assert after == 200


async def test_one_request_lost_is_sent_again_at_once(tmp_path: Path) -> None:
    """One loss (the keep-alive race's shape) is sent again at once on a new connection: no
    attempt fails, so nothing waits for the process's recheck."""
    with one_process_proxy(tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1})
        async with aiohttp.ClientSession() as session:
            await drop(session, proxy, 1)
            async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as r:
                status = r.status
        assert status == 200
        assert lost(proxy) == []

"""Client connections on a real proxy process: idle and half-sent connections are closed, the
connection cap closes the idlest, half-closed clients get their answer, a broken chunk gets a
400. Limits are small here (seconds, tens of connections) so that each test is quick."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.harness import ProxyProcess, proxy_config, running_proxy, wait_all_ready
from tests.support.rawhttp import (
    chat_body,
    connect,
    final_status,
    head,
    json_body,
    read_until_closed,
    request,
)

KEY = "sk-limits-0123456789"
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
KEEPALIVE_S = 3.0
CAP = 30
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    server = {
        "api_keys": [KEY],
        "header_timeout_s": HEADER_TIMEOUT_S,
        "body_timeout_s": BODY_TIMEOUT_S,
        "keepalive_timeout_s": KEEPALIVE_S,
        "max_connections": CAP,
    }
    with running_proxy(proxy_config(server=server), tmp_path_factory.mktemp("limits")) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 3})
        yield proxy


def metric(proxy: ProxyProcess, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def keyed_chat(proxy: ProxyProcess) -> int:
    with connect(proxy.port) as sock:
        sock.sendall(request(CHAT, chat_body(), KEY))
        data, _, _ = read_until_closed(sock)
    status = final_status(data)
    assert status is not None, data
    return status


def test_an_idle_connection_is_closed_after_the_keepalive_timeout(limited: ProxyProcess) -> None:
    with connect(limited.port) as sock:
        data, took, closed = read_until_closed(sock)
    assert closed and data == b""
    assert KEEPALIVE_S - 0.5 < took < KEEPALIVE_S + 1.5


def test_a_half_sent_request_head_is_closed_after_the_header_timeout(
    limited: ProxyProcess,
) -> None:
    with connect(limited.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data, took, closed = read_until_closed(sock)
    assert closed and data == b""
    assert HEADER_TIMEOUT_S - 0.2 < took < HEADER_TIMEOUT_S + 1.2  # well before keep-alive


def test_a_stalled_body_gets_408_and_the_connection_closes(limited: ProxyProcess) -> None:
    with connect(limited.port) as sock:
        sock.sendall(head(CHAT, KEY, Content_Length=100) + b'{"model":')
        data, took, closed = read_until_closed(sock)
    assert closed and final_status(data) == 408
    assert "no request body bytes" in json_body(data)["error"]["message"]
    assert BODY_TIMEOUT_S - 0.2 < took < BODY_TIMEOUT_S + 1.0


def test_past_the_cap_the_idlest_connections_are_closed_and_clients_still_served(
    limited: ProxyProcess,
) -> None:
    before = metric(limited, "mtp_proxy_client_connections_closed_total", 'cause="over_cap_idlest"')
    idle = [connect(limited.port) for _ in range(CAP + 10)]
    try:
        time.sleep(0.3)
        assert keyed_chat(limited) == 200  # the oldest idle ones made room
        assert metric(limited, "mtp_proxy_client_connections") <= CAP
        closed = metric(
            limited, "mtp_proxy_client_connections_closed_total", 'cause="over_cap_idlest"'
        )
        assert closed - before >= 10
        first = idle[0]
        first.settimeout(2)
        assert read_until_closed(first)[2]  # the longest idle went first
    finally:
        for sock in idle:
            sock.close()


def test_a_half_close_after_a_complete_request_still_gets_the_answer(
    limited: ProxyProcess,
) -> None:
    with connect(limited.port) as sock:
        sock.sendall(request(CHAT, chat_body(), KEY, close=False))
        sock.shutdown(socket.SHUT_WR)
        data, took, closed = read_until_closed(sock)
    assert final_status(data) == 200, data[:300]
    assert json_body(data)["choices"][0]["message"]["content"]
    assert closed and took < 5


def test_a_malformed_chunk_mid_body_gets_400_and_a_log_line(limited: ProxyProcess) -> None:
    with connect(limited.port) as sock:
        sock.sendall(head(CHAT, KEY, Transfer_Encoding="chunked") + b'5\r\n{"mod\r\n')
        time.sleep(0.3)  # the handler is reading the body by now
        sock.sendall(b"zz\r\nnot a chunk\r\n")
        data, took, closed = read_until_closed(sock)
    assert final_status(data) == 400 and closed
    assert "malformed request body" in json_body(data)["error"]["message"]
    assert took < BODY_TIMEOUT_S  # at once, not after the read deadline
    time.sleep(0.2)
    lines = [
        line
        for line in limited.log_lines()
        if line.get("event") == "request" and "malformed request body" in str(line.get("error"))
    ]
    assert lines and lines[-1]["status"] == 400


def test_past_the_cap_with_every_connection_busy_a_new_one_gets_503(limited: ProxyProcess) -> None:
    busy = [connect(limited.port) for _ in range(CAP)]
    try:
        for sock in busy:  # each one's handler waits for the rest of its body
            sock.sendall(head(CHAT, KEY, Content_Length=100) + b'{"model":')
        time.sleep(0.3)
        with connect(limited.port) as late:
            data, took, closed = read_until_closed(late)
        assert final_status(data) == 503 and closed and took < 0.5
        assert json_body(data)["error"]["message"] == "too many open connections"
    finally:
        for sock in busy:
            sock.close()

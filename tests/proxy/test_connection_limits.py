"""Client connections on a real proxy process: idle, half-sent, trickled and unread connections
are closed, the connection cap closes the idlest (then the slowest reader), half-closed clients
get their answers (pipelined ones too), a broken chunk gets a 400. Every close cause of
mtp_proxy_client_connections_closed_total is provoked here. Limits are small (seconds, tens of
connections) so that each test is quick; timings are bounded from below (nothing closes early)
and loosely from above (a loaded machine is slow, never wrong)."""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.misbehaving_backend import running_backend
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
MIN_RATE = 100.0  # bytes/s: a body of n bytes must be in within BODY_TIMEOUT_S + n / MIN_RATE
KEEPALIVE_S = 3.0
SEND_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 2.0  # a backend's silence mid-answer
CAP = 30
SLACK_S = 10.0  # how late a deadline may fire on a loaded machine
CHAT = "/v1/chat/completions"
CLOSED = "mtp_proxy_client_connections_closed_total"


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_backend("ok", "--chunks", "2") as url:
        yield url


def echo_model(url: str) -> dict[str, Any]:
    """tests/support/misbehaving_backend.py as model `echo`: each request picks its behaviour
    (X-Misbehave); room for every connection of the capped proxy at once."""
    return {
        "name": "echo",
        "backend": "simulator",
        "slots": 64,
        "profiles": [{"name": "e", "url": url}],
    }


@pytest.fixture(scope="module")
def limited(echo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """Short deadlines: header, body (pause and rate), keep-alive, send."""
    server = {
        "api_keys": [KEY],
        "header_timeout_s": HEADER_TIMEOUT_S,
        "body_timeout_s": BODY_TIMEOUT_S,
        "body_min_rate_bytes_s": MIN_RATE,
        "keepalive_timeout_s": KEEPALIVE_S,
        "send_timeout_s": SEND_TIMEOUT_S,
        "idle_timeout_s": IDLE_TIMEOUT_S,
    }
    demo = simulator_model(profiles=[{"name": "off"}])
    config = proxy_config([demo, echo_model(echo_url)], server=server)
    with running_proxy(config, tmp_path_factory.mktemp("limits")) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1, "echo": 1})
        yield proxy


@pytest.fixture(scope="module")
def capped(echo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """A small connection cap; deadlines long enough not to interfere."""
    server = {
        "api_keys": [KEY],
        "header_timeout_s": 60.0,
        "body_timeout_s": 60.0,
        "max_connections": CAP,
    }
    demo = simulator_model(profiles=[{"name": "off"}])
    config = proxy_config([demo, echo_model(echo_url)], server=server)
    with running_proxy(config, tmp_path_factory.mktemp("capped")) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1, "echo": 1})
        yield proxy


def metric(proxy: ProxyProcess, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def closed(proxy: ProxyProcess, cause: str) -> float:
    return metric(proxy, CLOSED, f'cause="{cause}"')


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)


def keyed_chat(proxy: ProxyProcess) -> int:
    with connect(proxy.port) as sock:
        sock.sendall(request(CHAT, chat_body(), KEY))
        data, _, _ = read_until_closed(sock)
    status = final_status(data)
    assert status is not None, data
    return status


def reading(proxy: ProxyProcess, path: str = CHAT) -> socket.socket:
    """A connection whose handler is reading its body, for sure: the head asks for 100 Continue,
    which aiohttp sends right before the proxy's middlewares run, with no pause in between
    (the connection is marked as reading before the proxy handles any other event)."""
    sock = connect(proxy.port)
    sock.sendall(head(path, KEY, Content_Length=100, Expect="100-continue") + b'{"model":')
    assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")
    return sock


def request_lines(
    proxy: ProxyProcess, keep: Callable[[dict[str, Any]], bool], since: int = 0
) -> list[Any]:
    """The proxy's request log lines that `keep` selects, from line `since` on, once written
    (they are deferred)."""
    found: list[Any] = []

    def written() -> bool:
        lines = proxy.log_lines()[since:]
        found[:] = [x for x in lines if x.get("event") == "request" and keep(x)]
        return bool(found)

    eventually(written)
    return found


# --- deadlines ----------------------------------------------------------------------------------


def test_an_idle_connection_is_closed_after_the_keepalive_timeout(limited: ProxyProcess) -> None:
    with connect(limited.port, timeout=KEEPALIVE_S + SLACK_S) as sock:
        data, took, was_closed = read_until_closed(sock)
    assert was_closed and data == b""
    assert took > KEEPALIVE_S - 0.5


def test_a_half_sent_request_head_is_closed_after_the_header_timeout(
    limited: ProxyProcess,
) -> None:
    before = closed(limited, "header_timeout")
    with connect(limited.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data, took, was_closed = read_until_closed(sock)
    assert was_closed and data == b""
    assert HEADER_TIMEOUT_S - 0.2 < took < KEEPALIVE_S  # before keep-alive would close it
    assert closed(limited, "header_timeout") == before + 1


@pytest.mark.parametrize("path", [CHAT, "/tokenize", "/v1/messages/count_tokens"])
def test_a_stalled_body_gets_408_and_the_connection_closes(
    limited: ProxyProcess, path: str
) -> None:
    """Generation and forwarded routes alike (forwarded ones once read with no deadline)."""
    with connect(limited.port, timeout=BODY_TIMEOUT_S + SLACK_S) as sock:
        sock.sendall(head(path, KEY, Content_Length=100) + b'{"model":')
        data, took, was_closed = read_until_closed(sock)
    assert was_closed and final_status(data) == 408, data
    assert "no request body bytes" in str(json_body(data))
    assert took > BODY_TIMEOUT_S - 0.2


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
def test_a_trickled_body_gets_408_once_below_the_least_rate(
    limited: ProxyProcess, path: str
) -> None:
    """One byte every 0.1 s never pauses for BODY_TIMEOUT_S, but arrives at 10 bytes/s:
    under MIN_RATE, so the whole body's deadline (BODY_TIMEOUT_S + bytes / MIN_RATE) passes."""
    data = b""
    began = time.monotonic()
    with connect(limited.port, timeout=0.1) as sock:
        sock.sendall(head(path, KEY, Content_Length=100_000))
        while time.monotonic() - began < BODY_TIMEOUT_S + SLACK_S:
            try:
                sock.sendall(b" ")
                if not (chunk := sock.recv(65536)):
                    break
                data += chunk
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    assert final_status(data) == 408, data
    assert "request body too slow" in str(json_body(data))


def test_a_stream_its_client_does_not_read_is_cut_and_frees_its_slot(
    limited: ProxyProcess,
) -> None:
    """A client that stops reading a stream (here: never reads) holds its backend slot until
    the send deadline: then the connection is cut, the request logged 499 and the slot freed."""
    check_unread_answer_is_cut(limited, stream=True)


def test_a_large_complete_answer_its_client_does_not_read_is_cut_too(
    limited: ProxyProcess,
) -> None:
    check_unread_answer_is_cut(limited, stream=False)


def check_unread_answer_is_cut(proxy: ProxyProcess, *, stream: bool) -> None:
    before, since = closed(proxy, "send_timeout"), len(proxy.log_lines())
    mode = "flood" if stream else "big-body:64"
    body = json.dumps({"model": "echo", "messages": [], "stream": stream}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    sock.connect(("127.0.0.1", proxy.port))
    with sock:
        sock.sendall(request(CHAT, body, KEY, X_Misbehave=mode))
        watch = select.poll()
        watch.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        assert watch.poll((SEND_TIMEOUT_S + SLACK_S) * 1000), "never cut"  # a reset: it ends now
        lines = request_lines(
            proxy, lambda x: x.get("model") == "echo" and x["status"] == 499, since
        )
    assert lines[-1]["stream"] is stream
    eventually(lambda: echo_in_flight(proxy) == 0)
    assert closed(proxy, "send_timeout") == before + 1


def echo_in_flight(proxy: ProxyProcess) -> int:
    status, answer = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200
    return int(next(b["in_flight"] for b in answer["backends"] if b["model"] == "echo"))


def test_a_complete_answer_that_stalls_mid_body_gets_502_after_the_idle_timeout(
    limited: ProxyProcess,
) -> None:
    """A backend that sends half of a complete answer and then nothing: after idle_timeout_s
    of silence the proxy gives up on it (the answer was held, nothing reached the client) and,
    with no other backend to try, answers 502 in the API's shape."""
    body = json.dumps({"model": "echo", "messages": []}).encode()
    began = time.monotonic()
    with connect(limited.port, timeout=IDLE_TIMEOUT_S + SLACK_S) as sock:
        sock.sendall(request(CHAT, body, KEY, X_Misbehave="stall-mid-body"))
        data, _, _ = read_until_closed(sock)
    took = time.monotonic() - began
    assert final_status(data) == 502, data[:300]
    assert "every backend tried failed" in json_body(data)["error"]["message"]
    assert took >= IDLE_TIMEOUT_S
    failures = request_lines(limited, lambda x: True)  # flushed: the warning is written too
    assert failures
    warned = [
        line
        for line in limited.log_lines()
        if line.get("event") == "upstream_unavailable" and "body lost" in str(line.get("error"))
    ]
    assert warned and "Timeout" in warned[-1]["error"], warned


# --- half-closes and pipelining -----------------------------------------------------------------


def test_a_half_close_after_a_complete_request_still_gets_the_answer(
    limited: ProxyProcess,
) -> None:
    with connect(limited.port) as sock:
        sock.sendall(request(CHAT, chat_body(), KEY, close=False))
        sock.shutdown(socket.SHUT_WR)
        data, took, was_closed = read_until_closed(sock)
    assert final_status(data) == 200, data[:300]
    assert json_body(data)["choices"][0]["message"]["content"]
    assert was_closed and took < KEEPALIVE_S  # closed once answered, not by keep-alive


def test_pipelined_requests_then_a_half_close_each_get_their_answer(
    limited: ProxyProcess,
) -> None:
    with connect(limited.port) as sock:
        first = request(CHAT, chat_body("first"), KEY, close=False)
        second = request("/tokenize", b'{"model": "echo"}', KEY, close=False)
        sock.sendall(first + second)
        sock.shutdown(socket.SHUT_WR)
        data, took, was_closed = read_until_closed(sock)
    assert re.findall(rb"HTTP/1\.1 ([2-5]\d\d) ", data) == [b"200", b"200"], data[-600:]
    assert data.rstrip().endswith(b'"path_qs": "/tokenize"}')  # the second answer, whole
    assert was_closed and took < KEEPALIVE_S


def test_a_half_close_in_the_middle_of_a_head_closes_after_a_grace(
    capped: ProxyProcess,
) -> None:
    """(On the proxy whose header deadline is long: the grace, 1 s, closes it first.)"""
    before = closed(capped, "half_closed")
    with connect(capped.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 1")
        sock.shutdown(socket.SHUT_WR)
        data, _, was_closed = read_until_closed(sock)
    assert was_closed and data == b""
    assert closed(capped, "half_closed") == before + 1


def test_a_malformed_chunk_mid_body_gets_400_and_a_log_line(limited: ProxyProcess) -> None:
    with connect(limited.port) as sock:
        chunked = head(CHAT, KEY, Transfer_Encoding="chunked", Expect="100-continue")
        sock.sendall(chunked + b'5\r\n{"mod\r\n')
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")  # its body is being read
        sock.sendall(b"zz\r\nnot a chunk\r\n")
        data, _, was_closed = read_until_closed(sock)
    assert final_status(data) == 400 and was_closed
    assert "malformed request body" in json_body(data)["error"]["message"]
    # at once: the read deadline would have answered 408 ("no request body bytes")
    lines = request_lines(limited, lambda x: "malformed request body" in str(x.get("error")))
    assert lines[-1]["status"] == 400


# --- the connection cap -------------------------------------------------------------------------


def test_past_the_cap_the_idlest_connections_are_closed_and_clients_still_served(
    capped: ProxyProcess,
) -> None:
    before = closed(capped, "over_cap_idlest")
    with ExitStack() as stack:
        idle = [stack.enter_context(connect(capped.port)) for _ in range(CAP - 1)]
        # /metrics is the CAP-th: every idle one is accepted once it answers
        eventually(lambda: metric(capped, "mtp_proxy_client_connections") >= CAP)
        idle += [stack.enter_context(connect(capped.port)) for _ in range(10)]
        assert keyed_chat(capped) == 200  # the oldest idle ones made room
        assert metric(capped, "mtp_proxy_client_connections") <= CAP
        assert closed(capped, "over_cap_idlest") - before >= 10
        idle[0].settimeout(2)
        assert read_until_closed(idle[0])[2]  # the longest idle went first


def test_past_the_cap_a_connection_still_reading_its_body_makes_room(
    capped: ProxyProcess,
) -> None:
    """Half-sent bodies hold nothing of the proxy's: past the cap, the connection waiting
    longest goes, reading or idle (before, a reading one counted as busy: enough of them locked
    everyone out). Here the readers came first, so the oldest reader goes, not the newer idle
    ones: abusers that reconnect at once push out each other, not a client that just came."""
    before = closed(capped, "over_cap_reading")
    with ExitStack() as stack:
        slow = [stack.enter_context(reading(capped)) for _ in range(CAP - 2)]
        idle = [stack.enter_context(connect(capped.port)) for _ in range(2)]
        assert keyed_chat(capped) == 200
        slow[0].settimeout(5)
        assert read_until_closed(slow[0])[2]  # the one reading longest went
        for sock in idle:
            sock.settimeout(0.5)
            assert not read_until_closed(sock)[2]  # the newer idle ones are still open
    assert closed(capped, "over_cap_reading") >= before + 1


def test_past_the_cap_with_every_connection_answering_a_new_one_gets_503(
    capped: ProxyProcess,
) -> None:
    before = closed(capped, "over_cap_refused")
    body = json.dumps({"model": "echo", "messages": [], "stream": True}).encode()
    with ExitStack() as stack:
        for _ in range(CAP):  # each one's stream has begun, and hangs: busy answering
            sock = stack.enter_context(connect(capped.port))
            # Left with a reset: a FIN alone may be a half-close, kept open for its answer.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(request(CHAT, body, KEY, X_Misbehave="hang-after-chunks:1"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with connect(capped.port) as late:
            data, took, was_closed = read_until_closed(late)
        assert final_status(data) == 503 and was_closed and took < SLACK_S
        assert json_body(data)["error"]["message"] == "too many open connections"
    refused_meanwhile = refused_until_served(capped)
    assert closed(capped, "over_cap_refused") == before + 1 + refused_meanwhile


def refused_until_served(proxy: ProxyProcess) -> int:
    """Wait for the event that the proxy has seen the resets of the connections that filled
    it: a new connection is served. A connection that comes before is refused (a loaded
    machine may hand the proxy the resets and the new connection at once, the new one first):
    the number refused, each counted as over_cap_refused."""
    refused = 0
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(proxy.url + "/metrics", timeout=10):
                return refused
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"too many open connections" in exc.read(), exc
        refused += 1
        assert time.monotonic() < deadline, "the proxy never saw the resets"
        time.sleep(0.05)


def test_a_large_complete_answer_is_relayed_without_being_held_whole(
    echo_url: str, tmp_path: Path
) -> None:
    """A 64 MiB complete answer read by its client: the proxy's peak memory (VmHWM) grows by a
    small part of it. It held and parsed the whole answer before, at 2-6 times its size."""
    config = proxy_config([echo_model(echo_url)], server={"api_keys": [KEY]})
    body = json.dumps({"model": "echo", "messages": []}).encode()
    with running_proxy(config, tmp_path) as proxy:
        before = peak_mib(proxy)
        data = bytearray()
        with connect(proxy.port, timeout=60) as sock:
            sock.sendall(request(CHAT, body, KEY, X_Misbehave="big-body:64"))
            while chunk := sock.recv(1 << 20):
                data += chunk
        assert final_status(bytes(data[:4096])) == 200 and len(data) > 64 << 20
        assert data.rstrip().endswith(b'"total_tokens":12}}')  # whole, usage last
        lines = request_lines(proxy, lambda x: x.get("model") == "echo" and x["status"] == 200)
        assert lines[-1]["output_tokens"] == 7  # its usage read from the answer's tail
        growth = peak_mib(proxy) - before
    assert growth < 16, f"the proxy's peak memory grew {growth:.1f} MiB for a 64 MiB answer"


def peak_mib(proxy: ProxyProcess) -> float:
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")

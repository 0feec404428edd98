"""Abuse of connections and slots: what one client can hold that others then lack.

Each case runs abusers in a process of their own (threads holding connections, each reopened
as soon as the proxy closes it, as a determined client would) while a keyed client probes the
proxy one request at a time for `window_s`; it reports the probes' answers (status: count) and
what the abusers got. Each case is a way a few clients could starve the rest before the proxy
bounded it (a whole-body deadline, the send timeout, the connection cap's choice of victim,
requests waiting through a restart, large answers relayed as they come):

- forwarded_stall: connections that send a forwarded route's head and part of its body,
  then nothing;
- trickle: connections that send a chat body one byte a second (never a long pause);
- unread_streams: streams whose clients never read, one per slot of a model;
- restart: clients looping requests on a model served by one process while it is restarted
  (POST /admin/backends/NAME/restart); counted are the 503s;
- big_answer: one 128 MiB complete answer relayed to a reading client; measured is the
  proxy's peak memory (VmHWM) before and after.

Loopback only; bounded in count (the arguments) and time (`window_s` per case).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.abusers import Attempt, abusers
from bench.processes import ProxyProcess

ECHO = "echo"  # tests/support/misbehaving_backend.py at a url: answers as each request asks
ONE = "one"  # a simulated model served by one process, profiles per request
_RCVBUF = 4096  # an unread stream fills this (and the proxy's buffers) at once


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _head(path: str, key: str, length: int, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {key}"]
    lines += [f"Content-Length: {length}", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(data: bytes) -> int:
    for line in data.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and not line.startswith(b"HTTP/1.1 1"):
            return int(line.split()[1])
    return 0  # closed without an answer


# --- abusers: each thread holds one connection until the proxy closes it, then opens another ---


def _hold_stalled(url: str, key: str, path: str, trickle_s: float, stop: Any) -> int:
    """A head and the start of a body, then nothing (trickle_s 0) or a byte every trickle_s."""
    with socket.create_connection(_address(url), timeout=10) as sock:
        sock.sendall(_head(path, key, 1_000_000) + b'{"model": "echo", "content": "')
        sock.settimeout(trickle_s or 0.5)
        data = b""
        while not stop.is_set():
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if trickle_s:
                    with contextlib.suppress(OSError):
                        sock.sendall(b"x")
                continue
            except OSError:
                return _status(data)
            if not chunk:
                return _status(data)
            data += chunk
    return -1  # still held when the case ended


def _hold_unread(url: str, key: str, stop: Any) -> int:
    """A stream of a model whose backend floods it, never read: -1 if still held at the end,
    else 499 (the proxy cut it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    sock.connect(_address(url))
    with sock:
        body = json.dumps({"model": ECHO, "messages": [], "stream": True}).encode()
        sock.sendall(_head("/v1/chat/completions", key, len(body), X_Misbehave="flood") + body)
        watch = select.poll()
        watch.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        while not stop.is_set():
            if watch.poll(500):
                return 499
    return -1


_HOLDERS: dict[str, Callable[..., int]] = {"stalled": _hold_stalled, "unread": _hold_unread}


def _holding(kind: str, *params: Any) -> Attempt:
    hold = _HOLDERS[kind]
    return lambda stop: hold(*params, stop)


def holders(
    kind: str, params: tuple[Any, ...], threads: int
) -> contextlib.AbstractContextManager[dict[int, int]]:
    """`threads` abusers of `kind` in another process while inside; then what they got."""
    return abusers(_holding, (kind, *params), threads, name=kind, pause_s=0.1)


# --- the keyed client's probes ------------------------------------------------------------------


def probe(url: str, key: str, window_s: float, model: str, **headers: str) -> dict[str, int]:
    """Requests of `model` one after another (a fresh connection each) for `window_s`:
    statuses (as strings, for JSON), "0" for a connection refused or cut."""
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + window_s
    while time.monotonic() < deadline:
        seen[str(request_once(url, key, model, headers))] += 1
    return dict(seen)


def request_once(url: str, key: str, model: str, headers: dict[str, str]) -> int:
    """One keyed streamed chat of `model`: its status, 0 if the connection failed."""
    host, port = _address(url)
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "stream": True,
        }
    )
    sent = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers}
    connection = http.client.HTTPConnection(host, port, timeout=60)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers=sent)
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        time.sleep(0.1)  # refused or cut: do not spin
        return 0
    finally:
        connection.close()


def _served(answers: dict[str, int]) -> str:
    total = sum(answers.values())
    return f"{answers.get('200', 0)}/{total}"


# --- the cases -------------------------------------------------------------------------------


def forwarded_stall(proxy: ProxyProcess, key: str, count: int, window_s: float) -> dict[str, Any]:
    params = (proxy.url, key, "/tokenize", 0.0)
    return _held_while_probed(proxy, key, "stalled", params, count, window_s, "mtp-demo")


def trickle(proxy: ProxyProcess, key: str, count: int, window_s: float) -> dict[str, Any]:
    params = (proxy.url, key, "/v1/chat/completions", 1.0)
    return _held_while_probed(proxy, key, "stalled", params, count, window_s, "mtp-demo")


def unread_streams(proxy: ProxyProcess, key: str, count: int, window_s: float) -> dict[str, Any]:
    params = (proxy.url, key)
    return _held_while_probed(
        proxy, key, "unread", params, count, window_s, ECHO, {"X-Misbehave": "ok"}
    )


def _held_while_probed(
    proxy: ProxyProcess,
    key: str,
    kind: str,
    params: tuple[Any, ...],
    count: int,
    window_s: float,
    model: str,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    with holders(kind, params, count) as abusers:
        time.sleep(1.0)  # let the abusers take what they can (their process starts)
        probes = probe(proxy.url, key, window_s, model, **(headers or {}))
    held = {str(status): n for status, n in sorted(abusers.items())}
    return {"served": _served(probes), "probes": probes, "abusers": held}


def restart(
    proxy: ProxyProcess, key: str, admin_key: str, clients: int, window_s: float
) -> dict[str, Any]:
    """`clients` threads looping requests of ONE; a third into the window, its process is
    restarted."""
    backend = f"{ONE}/one-process"
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            status = request_once(proxy.url, key, ONE, {})
            with lock:
                answers[str(status)] += 1

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for worker in workers:
        worker.start()
    time.sleep(window_s / 3)
    request = urllib.request.Request(
        f"{proxy.url}/admin/backends/{backend}/restart",
        method="POST",
        headers={"Authorization": f"Bearer {admin_key}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    time.sleep(window_s * 2 / 3)
    stop.set()
    for worker in workers:
        worker.join(120)
    result = dict(answers)
    return {"served": _served(result), "probes": result, "503s": result.get("503", 0)}


def big_answer(proxy: ProxyProcess, key: str, mib: int) -> dict[str, Any]:
    """One complete answer of `mib` MiB, read whole by the client: the proxy's peak memory
    (VmHWM) before and after."""
    before = _peak_mib(proxy)
    host, port = _address(proxy.url)
    connection = http.client.HTTPConnection(host, port, timeout=300)
    body = json.dumps({"model": ECHO, "messages": []})
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "X-Misbehave": f"big-body:{mib}",
    }
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        size = 0
        while chunk := response.read(1 << 20):
            size += len(chunk)
    finally:
        connection.close()
    after = _peak_mib(proxy)
    return {
        "status": response.status,
        "answer_mib": round(size / (1 << 20), 1),
        "peak_before_mib": before,
        "peak_after_mib": after,
        "growth_mib": round(after - before, 1),
    }


def _peak_mib(proxy: ProxyProcess) -> float:
    for line in Path(f"/proc/{proxy.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc (Linux only)")

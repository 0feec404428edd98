"""llama-server's keep-alive, which the proxy's and the supervisor's pools of connections stay
within (supervisor.connections; tests/proxy/test_upstream_keepalive.py shows what reusing a
connection the server closed costs) and the simulator copies: it closes a connection idle for the
time its answers announce, and not before.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from simulator.server import KEEPALIVE_S as SIMULATOR_KEEPALIVE_S
from supervisor.connections import LLAMA_SERVER_KEEPALIVE_S, POOLED_KEEPALIVE_S
from tests.support.llama_fixtures import LLAMA, make_models, running_llama_server

pytestmark = pytest.mark.llama


def _answer_head(connection: socket.socket) -> str:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(4096)
        assert chunk, received
        received += chunk
    return received.split(b"\r\n\r\n", 1)[0].decode()


def test_an_idle_connection_is_closed_at_the_announced_timeout(tmp_path: Path) -> None:
    models = make_models(tmp_path / "models")
    with (
        running_llama_server(models[LLAMA], log_dir=tmp_path / "logs") as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection,
    ):
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: llama\r\n\r\n")
        head = _answer_head(connection)
        answered = time.monotonic()
        assert connection.recv(64) == b"", "the server closed no idle connection"
        idle_s = time.monotonic() - answered
    announced = re.search(r"(?im)^keep-alive: timeout=(\d+)", head)
    assert announced is not None, head
    assert float(announced.group(1)) == LLAMA_SERVER_KEEPALIVE_S == SIMULATOR_KEEPALIVE_S
    assert idle_s >= LLAMA_SERVER_KEEPALIVE_S - 0.5  # not before (a lower bound: load only adds)
    # The pools drop their idle connections first, with room for a busy event loop.
    assert POOLED_KEEPALIVE_S <= LLAMA_SERVER_KEEPALIVE_S - 1.0

"""tests/unit's promise holds: a test there that opens a network socket or starts a process fails.

A pytest run of its own, with tests/unit's conftest hooks, over tests that break the promise in
each way (and some that keep it).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.unit_guard import no_network_no_processes

CHECKOUT = Path(__file__).resolve().parents[1]

CONFTEST = """
from tests.unit.conftest import pytest_runtest_call, pytest_runtest_setup, pytest_runtest_teardown
"""
INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""
TESTS = """
import asyncio
import multiprocessing
import os
import socket
import subprocess

import pytest


def test_binds_a_tcp_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


def test_connects_and_swallows_the_error():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    except Exception:
        pass


def test_sends_a_udp_datagram():
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.sendto(b"x", ("::1", 9))


def test_runs_a_program():
    subprocess.run(["true"], check=True)


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)


def test_starts_a_multiprocessing_process():
    process = multiprocessing.Process(target=print)
    process.start()
    process.join()


async def test_starts_an_asyncio_subprocess():
    process = await asyncio.create_subprocess_exec("true")
    await process.wait()


async def test_serves_on_a_tcp_port():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    server.close()


@pytest.fixture
def listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s


def test_uses_a_fixture_that_binds(listening):
    pass


@pytest.fixture
def spawns_at_teardown():
    yield
    subprocess.run(["true"], check=True)


def test_uses_a_fixture_that_spawns_at_teardown(spawns_at_teardown):
    pass


async def test_pure_with_an_event_loop_and_unix_sockets(tmp_path):
    await asyncio.sleep(0)
    a, b = socket.socketpair()
    a.sendall(b"x")
    assert b.recv(1) == b"x"
    a.close()
    b.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(tmp_path / "notify"))


def test_pure_and_last():
    assert True
"""
KEPT = {"test_pure_with_an_event_loop_and_unix_sockets", "test_pure_and_last"}
REFUSALS = (
    "socket.bind",
    "socket.connect",
    "socket.sendto",
    "subprocess.Popen",
    "os.fork",
    "asyncio.create_subprocess_exec",
)


def test_a_unit_test_that_opens_a_socket_or_starts_a_process_fails(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_promise.py").write_text(TESTS)
    argv = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)]
    argv += ["--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini")]
    # cwd: the checkout, so that the inner run imports tests.unit.conftest from it.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=CHECKOUT)
    outcomes: dict[str, set[str]] = {}  # a test that passes but fails at teardown has both
    for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\w+)", done.stdout, re.M):
        outcomes.setdefault(name, set()).add(outcome)
    names = re.findall(r"^(?:async )?def (test_\w+)", TESTS, re.M)
    assert set(outcomes) == set(names), done.stdout[-3000:]
    for name in names:
        assert (outcomes[name] == {"PASSED"}) == (name in KEPT), (name, done.stdout[-3000:])
    for refused in REFUSALS:  # the failure says what was refused
        assert refused in done.stdout


def test_the_guard_puts_everything_back() -> None:
    def calls() -> list[object]:
        return [subprocess.Popen._execute_child, os.fork, asyncio.create_subprocess_exec]

    before = (dict(vars(socket.socket)), calls())
    with no_network_no_processes() as refused:
        assert "bind" in vars(socket.socket) and calls() != before[1]
    assert refused == []
    assert (dict(vars(socket.socket)), calls()) == before
    assert subprocess.run(["true"], check=False).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))

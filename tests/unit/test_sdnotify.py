"""sd_notify client against real unix datagram sockets, as systemd would listen on them."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.lifecycle.sdnotify import notify


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield sock, path


def test_ready_reaches_a_path_socket(
    listener: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    assert notify("READY=1") is True
    assert sock.recv(4096) == b"READY=1"


def test_multi_line_message_arrives_as_one_datagram(
    listener: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    assert notify("STOPPING=1\nSTATUS=draining") is True
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"mtp-proxy-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1") is True
        assert sock.recv(4096) == b"READY=1"


def test_unset_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_failures_return_false_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path.sock")
    assert notify("READY=1") is False


@pytest.mark.timeout(10)
def test_full_socket_does_not_block(
    listener: tuple[socket.socket, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nobody reads: the receive queue fills, and sending must then fail at once, not block.
    _sock, path = listener
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    sent = 0
    while notify("STATUS=" + "x" * 8192):
        sent += 1
        assert sent < 100_000, "the socket never filled up"
    assert sent >= 1
    assert notify("READY=1") is False  # still full: no wait for the reader

"""The fast lane's promise: a unit test opens no network socket and starts no process.

While the guard is on, binding, connecting or sending on an AF_INET/AF_INET6 socket and starting
a process (subprocess, multiprocessing, os.fork/posix_spawn/system, asyncio's subprocesses) raise
``NotAUnitTest`` and are recorded: a test that catches the exception is still caught. Unix
sockets are allowed (asyncio's own socketpair is one). What it cannot see: sockets and processes
made in C outside Python's socket and subprocess modules (uvloop's libuv handles).
"""

from __future__ import annotations

import _posixsubprocess
import asyncio
import contextlib
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

_INET = (socket.AF_INET, socket.AF_INET6)
_SOCKET_CALLS = ("bind", "connect", "connect_ex", "sendto")
_PROCESS_CALLS = (  # (what the test did, where it is refused)
    ("subprocess.Popen", subprocess.Popen, "_execute_child"),  # run, check_output, os.popen ...
    ("_posixsubprocess.fork_exec", _posixsubprocess, "fork_exec"),  # multiprocessing's spawn
    ("os.fork", os, "fork"),  # multiprocessing's default start, os.spawn*
    ("os.forkpty", os, "forkpty"),
    ("os.posix_spawn", os, "posix_spawn"),
    ("os.posix_spawnp", os, "posix_spawnp"),
    ("os.system", os, "system"),
    # uvloop starts these without subprocess.Popen
    ("asyncio.create_subprocess_exec", asyncio, "create_subprocess_exec"),
    ("asyncio.create_subprocess_shell", asyncio, "create_subprocess_shell"),
)


class NotAUnitTest(RuntimeError):
    """The test did what tests/unit promises its tests never do."""


@contextlib.contextmanager
def no_network_no_processes() -> Iterator[list[str]]:
    """Refuse network sockets and new processes inside the block; yields what was refused."""
    refused: list[str] = []

    def refuse(what: str) -> NoReturn:
        refused.append(what)
        raise NotAUnitTest(f"{what}: tests/unit opens no network socket and starts no process")

    with contextlib.ExitStack() as undo:
        for name in _SOCKET_CALLS:
            guarded = _inet_refused(name, getattr(socket.socket, name), refuse)
            undo.enter_context(_replaced(socket.socket, name, guarded))
        for what, owner, name in _PROCESS_CALLS:
            undo.enter_context(_replaced(owner, name, _always_refused(what, refuse)))
        yield refused


@contextlib.contextmanager
def _replaced(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    own = name in vars(owner)  # socket.socket inherits its calls from _socket.socket
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _inet_refused(name: str, original: Any, refuse: Callable[[str], NoReturn]) -> Any:
    def guarded(self: socket.socket, *args: Any) -> Any:
        if self.family in _INET:
            refuse(f"socket.{name}({', '.join(map(repr, args))})")
        return original(self, *args)

    return guarded


def _always_refused(what: str, refuse: Callable[[str], NoReturn]) -> Any:
    def guarded(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(what)

    return guarded

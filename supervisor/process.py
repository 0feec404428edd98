"""One spawned child process in its own process group: output capture, signals, stop.

Knows nothing of states or health; `child.py` decides when to call what.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from structlog.typing import FilteringBoundLogger

TAIL_LINES = 50  # lines kept for error messages
_MAX_LINE = 4000  # characters; a runaway line must not fill the log
_READ_CHUNK = 65536
_POLL_S = 0.05  # process-group liveness poll while stopping
_KILL_WAIT_S = 5.0  # SIGKILL is not ignorable; this only bounds a process stuck in the kernel
_READERS_WAIT_S = 1.0  # output still buffered in the pipes after the exit


def free_loopback_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def living_group_members(pgid: int) -> list[int]:
    """PIDs of the group's processes that are not zombies.

    A zombie is dead: only its parent (or PID 1 for orphans) can reap it, and some container
    init processes never do, so `killpg(pgid, 0)` alone would report it alive.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces or parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _prctl() -> Callable[..., int] | None:
    # Looked up in the parent (dlsym after fork could wait on a lock another thread held).
    try:
        function: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return function


def parent_death_hook() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child die with this process (None off Linux)."""
    return functools.partial(_die_with_parent, os.getpid()) if _prctl() is not None else None


def die_with_parent() -> bool:
    """Make the calling process die with its parent (also for children not started by Popen,
    such as multiprocessing's). False off Linux or when refused."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _die_with_parent(parent_pid: int) -> None:
    """In the child, before exec: SIGKILL when the proxy dies, even by kill -9 (Linux).

    The signal fires when the thread that spawned the child exits: asyncio spawns from the
    event loop's thread, which lives as long as the proxy. Without this, a killed proxy left
    its llama-servers running, listening and holding GPU memory. prctl is looked up before
    the fork, so the child only calls it.
    """
    if not die_with_parent():
        return  # not Linux, or refused: the supervisor's own stop still ends the child
    if os.getppid() != parent_pid:  # the proxy died between fork and prctl
        os._exit(1)


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream protocol that also reports the exit itself.

    `asyncio.subprocess.Process.wait()` (3.11) returns only once the pipes are closed too, so a
    grandchild holding them open would hide the exit; `process_exited` fires on the exit alone.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class ChildProcess:
    """A running child: created by `spawn`, ended by `terminate` or `kill` (both idempotent)."""

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _ExitProtocol,
        log: FilteringBoundLogger,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._log = log
        self.pid: int = transport.get_pid()
        self.pgid = self.pid  # start_new_session: the child leads its own group
        self.started_at = time.monotonic()
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._readers = [
            asyncio.create_task(self._capture(stream, name), name=f"capture-{self.pid}-{name}")
            for stream, name in ((protocol.stdout, "stdout"), (protocol.stderr, "stderr"))
            if stream is not None
        ]
        self._closed = False

    @classmethod
    async def spawn(
        cls, argv: Sequence[str], env: Mapping[str, str], log: FilteringBoundLogger
    ) -> ChildProcess:
        """Start argv (never through a shell) in a new session; OSError if it cannot start."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExitProtocol(limit=_READ_CHUNK, loop=loop),
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            preexec_fn=parent_death_hook(),
        )
        return cls(transport, protocol, log)

    @property
    def returncode(self) -> int | None:
        return self._transport.get_returncode()

    @property
    def exited(self) -> bool:
        return self._protocol.exited.done()

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait up to timeout_s for the exit; True if the process has exited."""
        if not self.exited:
            await asyncio.wait([self._protocol.exited], timeout=timeout_s)
        return self.exited

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send sig to the whole process group; False if the group is gone."""
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        return True

    async def terminate(self, stop_timeout: float) -> int | None:
        """SIGTERM to the group, wait for all of it up to stop_timeout, then SIGKILL."""
        deadline = time.monotonic() + stop_timeout
        if self.signal_group(signal.SIGTERM):
            # Like systemd: a stopped (SIGSTOP) process only acts on SIGTERM once continued.
            self.signal_group(signal.SIGCONT)
            await self.wait(stop_timeout)
            # The rest of the group got the same SIGTERM: give it the same grace.
            while time.monotonic() < deadline:
                if not living_group_members(self.pgid):
                    break
                await asyncio.sleep(_POLL_S)
        if not self.exited or living_group_members(self.pgid):
            self._log.warning("still running after SIGTERM, sending SIGKILL", pgid=self.pgid)
        return await self.kill()

    async def kill(self) -> int | None:
        """SIGKILL the group, wait for the exit, release pipes and transport."""
        self.signal_group(signal.SIGKILL)
        await self.wait(_KILL_WAIT_S)
        await self.close()
        return self.returncode

    async def close(self) -> None:
        """After the exit: kill what is left of the group, collect the last output."""
        if self._closed:
            return
        # Leftover group members (a wrapper's children) would keep the pipes open.
        self.signal_group(signal.SIGKILL)
        try:
            _, pending = await asyncio.wait(self._readers, timeout=_READERS_WAIT_S)
            for task in pending:
                task.cancel()
        finally:
            self._closed = True
            self._transport.close()

    async def _capture(self, stream: asyncio.StreamReader, name: str) -> None:
        """Log the child's output line by line and keep the last lines."""
        log = self._log.bind(stream=name, pid=self.pid)
        buffer = b""
        try:
            while chunk := await stream.read(_READ_CHUNK):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                if len(buffer) > _READ_CHUNK:  # no newline in sight: flush what we have
                    complete.append(buffer)
                    buffer = b""
                for raw in complete:
                    self._emit(log, raw)
        except OSError as exc:  # the pipe broke: the exit is reported elsewhere
            log.debug("output capture ended", error=str(exc))
        if buffer:
            self._emit(log, buffer)

    def _emit(self, log: FilteringBoundLogger, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")[:_MAX_LINE]
        if not line.strip():
            return
        self.lines.append(line)
        log.info(line)

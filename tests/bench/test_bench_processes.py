"""A benchmark's processes end with it, whatever ends it: `python -m bench.routing` stopped by
SIGTERM (as `timeout` stops it) or SIGKILL leaves no proxy and no simulator behind (two were
once found still running 30 and 49 minutes later)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import trace_gen
from proxy.workloads.trace import write_trace

CHECKOUT = Path(__file__).resolve().parents[2]


def children_of() -> dict[int, list[int]]:
    """Every live process's children (from /proc), zombies left out."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        if state not in ("Z", "X"):
            tree.setdefault(int(ppid), []).append(int(entry.name))
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = children_of(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def eventually(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_routing_benchmark_leaves_no_process_behind(
    tmp_path: Path, sig: signal.Signals
) -> None:
    path = tmp_path / "tiny.jsonl"
    write_trace(path, trace_gen.tiny_concurrent_trace())
    argv = [sys.executable, "-m", "bench.routing", "--trace", str(path), "--preset", "setup-b"]
    argv += ["--time-scale", "1", "--json", "--policies", "static:off", "--repeat", "5"]
    bench = subprocess.Popen(
        argv, cwd=CHECKOUT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    started: set[int] = set()
    try:

        def serving() -> bool:  # its proxy runs, and the proxy's simulator
            started.update(descendants(bench.pid))
            commands = [command(pid) for pid in started]
            return any("-m proxy.cli" in c for c in commands) and any(
                "-m simulator" in c for c in commands
            )

        assert eventually(serving, 120), [command(p) for p in started]
        bench.send_signal(sig)
        bench.wait(60)
        left = {pid for pid in started if alive(pid)}
        assert eventually(lambda: not any(alive(pid) for pid in left), 30), [
            command(pid) for pid in left if alive(pid)
        ]
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()
            bench.wait()

"""The simulator as a real process on a loopback port, and the HTTP calls the tests make to it."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")
MAX3 = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]


class Sim:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"


@contextmanager
def simulator(*args: str, wait_ready: bool = True) -> Iterator[Sim]:
    """Start `python -m simulator --port 0 ARGS` and learn its port from the listening line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        deadline, seen = time.monotonic() + 20, b""
        while (match := _LISTENING.search(seen)) is None:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"simulator did not start: {seen!r}"
            ready, _, _ = select.select([proc.stderr], [], [], left)
            if ready:
                seen += os.read(proc.stderr.fileno(), 4096)
        sim = Sim(proc, int(match.group(1)))
        if wait_ready:
            _wait_healthy(sim.url)
        yield sim
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.URLError:
            time.sleep(0.02)
    raise AssertionError("simulator never became healthy")


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json()


async def sse(http: aiohttp.ClientSession, url: str, body: Any) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each server-sent event."""
    async with http.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = (await r.read()).decode()
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        name = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        events.append((name, data))
    return events


def metric_values(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"[{v}]" for v in sample.labels.values())
            out[key] = sample.value
    return out

"""A proxy in front of a pool of real llama-server processes, and ways to watch it from a test.

The pool: one tiny qwen35 model (identity MTP block on a bigram trunk: every draft is accepted)
served by three profiles, off / min (draft-mtp n_max 2, n_min 1) / max (draft-mtp n_max 3), each
with -t 1 (several servers share 2 cores). Backends are found through /admin/backends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tests.support.harness import ADMIN_KEY, ProxyProcess, proxy_config
from tests.support.llama_fixtures import QWEN35_MTP_IDENTITY, llama_server_binary, make_models

MODEL = "tiny"
ARGS = ["-c", "2048", "-np", "2", "-t", "1"]
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]
# Shrunk so fault tests take seconds (the defaults' ~15 s / ~30 s windows are checked in
# test_supervisor_states.py). backoff_initial_s is the default: restart times are realistic.
FAST_SUPERVISOR: dict[str, Any] = {
    "health_interval_s": 0.25,
    "health_timeout_s": 0.5,
    "ready_poll_s": 0.05,
    "unhealthy_after_s": 1.0,
    "replace_after_s": 2.0,
    "ready_timeout_s": 30.0,
    "stop_timeout_s": 5.0,
    "drain_timeout_s": 10.0,
    "stagger_s": 0.0,
    "backoff_initial_s": 0.5,
    "backoff_max_s": 4.0,
    "crash_loop_count": 3,
    "crash_loop_window_s": 60.0,
}
CHAT = [{"role": "user", "content": "hello world"}]
T = TypeVar("T")


def identity_model(directory: Path) -> Path:
    """The qwen35 identity-MTP model (draft acceptance 100%), generated once per directory."""
    return make_models(directory)[QWEN35_MTP_IDENTITY]


def llama_model(
    model_path: Path,
    *,
    name: str = MODEL,
    profiles: list[dict[str, Any]] | None = None,
    args: list[str] | None = None,
    draft_control: str = "per-process",
) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "llama-server",
        "draft_control": draft_control,
        "binary": llama_server_binary(),
        "model_path": str(model_path),
        "args": list(args or ARGS),
        "profiles": [dict(profile) for profile in profiles or PROFILES],  # callers may edit
    }


def llama_config(
    model_path: Path,
    *,
    profiles: list[dict[str, Any]] | None = None,
    supervisor: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    models: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A proxy config (admin key tests.support.harness.ADMIN_KEY) over a real llama-server pool."""
    return proxy_config(
        models or [llama_model(model_path, profiles=profiles)],
        supervisor={**FAST_SUPERVISOR, **(supervisor or {})},
        server=server,
    )


async def admin_backends(session: aiohttp.ClientSession, proxy: ProxyProcess) -> dict[str, Any]:
    """/admin/backends as {name: row}."""
    headers = {"X-Admin-Key": ADMIN_KEY}
    async with session.get(proxy.url + "/admin/backends", headers=headers) as response:
        assert response.status == 200, await response.text()
        rows = (await response.json())["backends"]
    return {row["name"]: row for row in rows}


async def wait_until(
    poll: Callable[[], Awaitable[T | None]], timeout: float, interval: float = 0.05
) -> tuple[T, float]:
    """Call poll until it returns something; (that value, seconds waited). Fails on timeout."""
    began = time.monotonic()
    while True:
        value = await poll()
        if value is not None:
            return value, time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise AssertionError(f"condition not met within {timeout:g}s")
        await asyncio.sleep(interval)


async def wait_state(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float,
) -> tuple[dict[str, Any], float]:
    """Wait until the backend's admin row satisfies predicate; (row, seconds waited)."""

    async def poll() -> dict[str, Any] | None:
        row = (await admin_backends(session, proxy)).get(name)
        return row if row is not None and predicate(row) else None

    return await wait_until(poll, timeout)


async def all_ready(session: aiohttp.ClientSession, proxy: ProxyProcess, timeout: float) -> None:
    async def poll() -> bool | None:
        rows = await admin_backends(session, proxy)
        return True if all(r["state"] == "ready" for r in rows.values()) else None

    await wait_until(poll, timeout)


async def chat(
    session: aiohttp.ClientSession,
    proxy: ProxyProcess,
    *,
    profile: str | None = None,
    max_tokens: int = 16,
    model: str = MODEL,
) -> tuple[int, dict[str, str], Any]:
    """A non-stream chat completion; (status, response headers, JSON body)."""
    headers = {"X-MTP-Profile": profile} if profile else {}
    body = {"model": model, "messages": CHAT, "max_tokens": max_tokens, "temperature": 0}
    async with session.post(
        proxy.url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        return response.status, dict(response.headers), json.loads(await response.read())


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie is dead, only unreaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def log_events(proxy: ProxyProcess, event: str) -> list[dict[str, Any]]:
    return [line for line in proxy.log_lines() if line.get("event") == event]

"""One /health check of a backend."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class HealthCheck:
    """What one /health request found."""

    ok: bool  # 200: ready to serve
    detail: str  # what was seen, for logs and state reasons


async def check_health(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float
) -> HealthCheck:
    """GET {base_url}/health. llama-server: refused, then 503 "Loading model", then 200."""
    try:
        async with session.get(
            f"{base_url.rstrip('/')}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            if response.status == 200:
                return HealthCheck(ok=True, detail="200")
            text = await response.text(errors="replace")
            return HealthCheck(ok=False, detail=f"{response.status} {_message(text)}")
    except TimeoutError:
        return HealthCheck(ok=False, detail=f"no answer within {timeout_s:g}s")
    except aiohttp.ClientConnectorError as exc:
        return HealthCheck(ok=False, detail=f"cannot connect: {exc.os_error.strerror or exc}")
    except (aiohttp.ClientError, asyncio.IncompleteReadError, OSError) as exc:
        return HealthCheck(ok=False, detail=f"{type(exc).__name__}: {exc}")


def _message(text: str) -> str:
    """llama-server: {"error": {"message": "Loading model", ...}}; show the message, not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else text.strip()[:200]

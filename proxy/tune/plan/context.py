"""The backend's real context, read before the workload is sized.

The config's ``-c`` is what was asked for, not what the server runs: llama-server caps it at the
model's trained context, ``--fit`` shrinks it to the memory, and ``-np`` splits it between the
slots. ``GET /props`` says what one slot holds (``default_generation_settings.n_ctx``), and
``POST /tokenize`` on a sample of code and of prose says how many characters this tokenizer puts
in a token, so a prompt is sized in the server's own tokens. Both are read straight from a
backend tune started, or through the running proxy (which forwards both routes).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from proxy.workloads import texts

_SAMPLE_CHARS = 6000
_TIMEOUT = aiohttp.ClientTimeout(total=60)


class ContextError(RuntimeError):
    """The backend did not say its context; the message says what it answered."""


@dataclass(frozen=True)
class ServerContext:
    n_ctx: int
    """Tokens one slot holds: prompt and output together."""
    slots: int | None
    chars_per_token: dict[str, float]
    """By content kind (code, prose): characters per token of this backend's tokenizer."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerContext:
        ratios = {str(k): float(v) for k, v in dict(data["chars_per_token"]).items()}
        slots = data.get("slots")
        return cls(int(data["n_ctx"]), None if slots is None else int(slots), ratios)


def samples() -> dict[str, str]:
    """The text the tokenizer is measured on: generated as the workload's own."""
    rng = random.Random(5)
    return {
        "code": texts.code_file(rng, _SAMPLE_CHARS),
        "prose": texts.prose(rng, _SAMPLE_CHARS),
    }


async def read_context(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ServerContext:
    """n_ctx per slot from /props, characters per token from /tokenize. ``model`` names the
    model when asking through the proxy (it forwards to a backend of that model)."""
    query = {"model": model} if model else None
    try:
        async with session.get(
            base_url + "/props", params=query, headers=headers, timeout=_TIMEOUT
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise ContextError(f"GET /props answered {resp.status}: {text[:200]}")
            props = await resp.json(content_type=None)
        n_ctx = props["default_generation_settings"]["n_ctx"]
        slots = props.get("total_slots")
        ratios = {}
        for kind, sample in samples().items():
            body: dict[str, Any] = {"content": sample, **({"model": model} if model else {})}
            async with session.post(
                base_url + "/tokenize", json=body, headers=headers, timeout=_TIMEOUT
            ) as resp:
                if resp.status != 200:
                    raise ContextError(f"POST /tokenize answered {resp.status}")
                tokens = len((await resp.json(content_type=None))["tokens"])
            ratios[kind] = round(len(sample) / max(tokens, 1), 3)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        raise ContextError(f"{base_url}: cannot read the context ({exc!r})") from None
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        raise ContextError(f"{base_url}: /props says n_ctx {n_ctx!r}")
    return ServerContext(n_ctx, slots if isinstance(slots, int) else None, ratios)

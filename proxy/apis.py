"""The wire contract: which path is which API, each API's error dialect, the per-request depth
key, and the status logged for a client that left.

The error envelopes themselves are built in ``serving.errors``; this module says which one a
request gets. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Literal

from supervisor.completion import DEPTH_KEY

__all__ = [
    "API_OF_PATH",
    "CLIENT_CLOSED",
    "DEPTH_KEY",
    "Api",
    "Dialect",
    "dialect_of",
    "dialect_of_path",
    "twins",
]

Api = Literal["chat", "completions", "responses", "messages"]
Dialect = Literal["openai", "anthropic"]


def twins(*paths: str) -> tuple[str, ...]:
    """Each path as ``/v1/PATH`` and as ``/PATH``: llama-server serves both alike."""
    return tuple(twin for path in paths for twin in (f"/v1/{path}", f"/{path}"))


API_OF_PATH: dict[str, Api] = {
    **dict.fromkeys(twins("chat/completions"), "chat"),
    **dict.fromkeys(twins("completions"), "completions"),
    **dict.fromkeys(twins("responses"), "responses"),
    "/v1/messages": "messages",
    # llama-server's native completion API: same prompt, its own answer shape, timings included.
    "/completion": "completions",
    # llama-server's code infill: /completion's answer for a prefix and a suffix (it generates,
    # so it takes a slot and a depth like any completion).
    "/infill": "completions",
}
"""The generation routes: each path and the API it speaks."""

CLIENT_CLOSED = 499
"""nginx's status for a request whose client left before its answer ended (logged, never sent)."""

# DEPTH_KEY, the flat top-level body key "speculative.n_max" (an integer, 0 = no drafting for this
# request), is defined beside the draft-control probe that asks a backend whether it honours it:
# the supervisor never imports the proxy. The simulator, a program of its own standing for
# llama-server, spells it again (simulator/depth.py); tests/unit/test_apis.py keeps the two equal.


def dialect_of(api: str) -> Dialect:
    """The error dialect of an API: Anthropic's for Messages, OpenAI's for the others."""
    return "anthropic" if api == "messages" else "openai"


def dialect_of_path(path: str) -> Dialect:
    """The error dialect of any path a client calls, routed or not: Anthropic's for Messages
    and its token counter (so a 401, 404 or 405 there reads like Anthropic's), else OpenAI's."""
    trimmed = path.rstrip("/")
    anthropic = trimmed.endswith("/messages") or trimmed.endswith("/messages/count_tokens")
    return "anthropic" if anthropic else "openai"

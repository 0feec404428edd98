"""Pooled HTTP connections to llama-server that stay within its keep-alive.

llama-server closes a keep-alive connection idle 5 s (cpp-httplib's default; its answers say
`Keep-Alive: timeout=5`). A request sent on such a connection just as the server closes it is
lost before its first byte (aiohttp: ServerDisconnectedError), and aiohttp keeps an idle
connection 15 s by default. A pool that drops its idle connections well before the server does
never sends on one the server may have closed, even on an event loop that runs late.
"""

from __future__ import annotations

import aiohttp

LLAMA_SERVER_KEEPALIVE_S = 5.0
POOLED_KEEPALIVE_S = 3.0


def backend_connector(*, enable_cleanup_closed: bool = False) -> aiohttp.TCPConnector:
    """A connector for requests to backends: no connection cap (the backends' slots and the
    admission queue bound concurrency), idle connections dropped at POOLED_KEEPALIVE_S."""
    return aiohttp.TCPConnector(
        limit=0,
        keepalive_timeout=POOLED_KEEPALIVE_S,
        enable_cleanup_closed=enable_cleanup_closed,
    )

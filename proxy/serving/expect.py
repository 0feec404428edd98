"""The Expect request header, answered on every route the proxy serves.

aiohttp runs a route's expect handler before any middleware: its default answers an expectation
other than 100-continue with a plain-text 417, which no SDK can read. This one does what aiohttp
does for 100-continue and refuses the rest in the API's own error shape.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from proxy.apis import dialect_of_path
from proxy.serving.errors import error_response


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """None to go on with the request (after a 100 Continue when asked), else the 417."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None  # HTTP/1.0 has no expectations; aiohttp ignores the header there too
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's own bytes start after the interim one
        return None
    message = f"unsupported expectation {expect[:80]!r}: only 100-continue is supported"
    return error_response(dialect_of_path(request.path), 417, message)

"""Reading a request body: size limit, read deadline, framing errors and gzip, each a clear answer.

The body is read only once the client is authenticated (the auth middleware runs first), and
aiohttp's own decompression is off (`auto_decompress=False` on the runner): it inflated gzip
bodies whole on the event loop, even for requests answered 401 or 413.

- Each read waits at most `timeout_s` for more bytes (nginx's client_body_timeout): 408.
- The whole body must arrive within `timeout_s` plus one second per `min_rate` bytes received
  (a least average rate, as Apache's mod_reqtimeout MinRate): a body trickled a byte at a time
  cannot hold its connection for ever by never pausing long enough: 408.
- While the body is read, its connection may be closed to make room for a new one past the
  connection cap (proxy.serving.connections), as an idle one may.
- More than `max_bytes` on the wire, or once inflated: 413.
- A broken chunked framing or a body shorter than its Content-Length: 400.
- `Content-Encoding: gzip` is inflated in bounded steps in a worker thread (zlib releases the
  GIL), one body at a time, and forwarded as plain bytes, the header removed
  (proxy.serving.forward); a body that is not valid gzip is a 400; any other encoding is a 415.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from proxy.config.settings import ServerSettings
from proxy.serving.connections import reading

_GZIP = frozenset({"gzip", "x-gzip"})
_PLAIN = frozenset({"", "identity"})
_STEP = 1 << 20  # bytes inflated per zlib call: a bomb is stopped within one step of the limit


class BodyRefused(Exception):
    """The body cannot be used; `status` and `message` are the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class BodyLimits:
    """How large a body may be and how slowly it may come (the [server] settings)."""

    max_bytes: int
    timeout_s: float  # the longest pause between two reads, and the whole body's grace
    min_rate: float  # bytes per second on average past the grace; 0: no whole-body deadline

    @classmethod
    def of(cls, server: ServerSettings) -> BodyLimits:
        return cls(server.max_body_bytes, server.body_timeout_s, server.body_min_rate_bytes_s)

    def whole_deadline(self, began: float, received: int) -> float:
        """When the body must be complete, having received `received` bytes so far."""
        if self.min_rate <= 0:
            return math.inf
        return began + self.timeout_s + received / self.min_rate


async def read_body(
    request: web.Request, limits: BodyLimits, *, inflating: asyncio.Semaphore
) -> bytes:
    """The request's body as plain bytes, or BodyRefused. `inflating` bounds the gzip bodies
    inflated at once (one core's worth: the event loop keeps the other)."""
    max_bytes = limits.max_bytes
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in _PLAIN and encoding not in _GZIP:
        raise BodyRefused(415, f"Content-Encoding {encoding[:50]!r} is not supported; use gzip")
    length = request.content_length
    if length is not None and length > max_bytes:
        raise BodyRefused(413, f"request body exceeds {max_bytes} bytes")
    with reading(request):
        raw = await _read_raw(request, limits)
    if encoding in _GZIP:
        async with inflating:
            return await asyncio.to_thread(inflate_gzip, raw, max_bytes)
    return raw


async def _read_raw(request: web.Request, limits: BodyLimits) -> bytes:
    chunks: list[bytes] = []
    size = 0
    content = request.content
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        paused_at = loop.time() + limits.timeout_s
        whole_at = limits.whole_deadline(began, size)
        try:
            async with asyncio.timeout_at(min(paused_at, whole_at)):
                chunk = await content.readany()
        except TimeoutError:
            if whole_at < paused_at:
                message = (
                    f"request body too slow: under {limits.min_rate:g} bytes/s after "
                    f"{limits.timeout_s:g} s"
                )
                raise BodyRefused(408, message) from None
            raise BodyRefused(408, f"no request body bytes for {limits.timeout_s:g} s") from None
        except HttpProcessingError as exc:
            raise BodyRefused(400, f"malformed request body: {exc.message}") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limits.max_bytes:
            raise BodyRefused(413, f"request body exceeds {limits.max_bytes} bytes")
        chunks.append(chunk)


def inflate_gzip(data: bytes, max_bytes: int) -> bytes:
    """Inflate gzip data (every member), at most `max_bytes` of output (BodyRefused 413 past
    it, 400 when it is not gzip). Blocking: run it in a worker thread."""
    out: list[bytes] = []
    size = 0
    while data:
        inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        try:
            while data and not inflater.eof:
                piece = inflater.decompress(data, _STEP)
                size += len(piece)
                if size > max_bytes:
                    raise BodyRefused(413, f"request body exceeds {max_bytes} bytes once inflated")
                out.append(piece)
                data = inflater.unconsumed_tail
            rest = inflater.flush()  # what zlib still holds: under one window (32 KiB)
            size += len(rest)
            if size > max_bytes:
                raise BodyRefused(413, f"request body exceeds {max_bytes} bytes once inflated")
            out.append(rest)
        except zlib.error as exc:
            raise BodyRefused(400, f"request body is not valid gzip: {exc}") from None
        if not inflater.eof:
            raise BodyRefused(400, "request body is not valid gzip: truncated")
        data = inflater.unused_data  # the next member, if any
    return b"".join(out)

"""Forwarding one request to one backend and relaying its answer byte for byte.

A failure before anything reached the client raises `UpstreamUnavailable`, which the caller may
retry on another backend. Once the first byte of a stream has gone out, a failure ends the stream
with an error event in the stream's own format: never a silently truncated stream. A complete
(non-stream) answer is held whole up to 1 MiB (a failure before its end may still be retried),
and relayed as it comes past that, never held whole: the proxy keeps only what its telemetry
reads (`KeptBody`), and a failure then cuts the client's connection (a short body, never one
that looks complete).

Every write to the client has a deadline (`Timeouts.send_s`, nginx's send_timeout): a client
that reads nothing for that long has its connection cut (`SendTimedOut`, logged 499), so that it
cannot hold a backend slot by not reading.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import yarl
from aiohttp import web
from multidict import CIMultiDict

from proxy.compat.template_refusal import STATUS as TEMPLATE_REFUSAL_STATUS
from proxy.compat.template_refusal import template_refusal
from proxy.serving.connections import ANSWER_COMPLETE, CONNECTIONS
from proxy.serving.errors import stream_error_event

# Headers that describe one hop, not the message (RFC 9110 section 7.6.1), plus those aiohttp
# recomputes. Accept-Encoding is dropped so the bytes we read (for telemetry) are plain.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
# Request headers that are the proxy's business only: the body goes upstream plain and complete
# (so neither its encoding nor an Expect: 100-continue applies any more: a backend that never
# sends 100 would hang the request), and the admin key is for the proxy alone.
_NOT_FORWARDED = frozenset({"content-encoding", "expect", "x-admin-key"})
_CLIENT_CREDENTIALS = frozenset({"authorization", "x-api-key"})
_PLAIN = "identity"  # Accept-Encoding upstream: the telemetry reads the bytes as they come
_UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)
_RETRYABLE_STATUS = frozenset({502, 503})


class UpstreamUnavailable(Exception):
    """The backend failed before any byte reached the client: safe to retry elsewhere."""


class SendTimedOut(ConnectionResetError):
    """The client read nothing of its answer for the send deadline; its connection is cut.
    A ConnectionError: whoever handles a client that left handles this one (499)."""


class ChunkSink(Protocol):
    def feed(self, chunk: bytes, now: float | None = None) -> None: ...


class ChunkRewriter(Protocol):
    """Changes a stream's bytes on their way to the client (whole events in, whole events out)."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


# The event that ends a complete answer, per API, as bytes no JSON string can contain unescaped
# (a quote or a real newline): once it reached the client, the answer is complete even if the
# client closes before the stream's own end (Codex does, right after response.completed).
_FINAL_EVENTS: dict[str, tuple[bytes, ...]] = {
    "chat": (b"\n\ndata: [DONE]",),
    "completions": (b"\n\ndata: [DONE]", b'"stop":true'),  # /completion's native last chunk
    "responses": (b"\nevent: response.completed\n", b'"type":"response.completed"'),
    "messages": (b"\nevent: message_stop\n", b'"type":"message_stop"'),
}


@dataclass(frozen=True)
class Timeouts:
    connect_s: float
    first_byte_s: float
    idle_s: float
    send_s: float = 60.0  # a write to the client may wait this long for it to read

    @functools.cached_property
    def until_first_byte(self) -> aiohttp.ClientTimeout:
        """The upstream request's timeouts up to the response head (made once, not per request:
        ~30 us on a cold path)."""
        return aiohttp.ClientTimeout(
            total=None, sock_connect=self.connect_s, sock_read=self.first_byte_s
        )


@dataclass
class Relayed:
    """How a relay went, for telemetry, metrics and the request's log line."""

    status: int
    streamed: bool
    body: bytes = b""
    first_chunk_at: float | None = None
    last_chunk_at: float | None = None
    chunks: int = 0
    upstream_error: str | None = None
    final_relayed: bool = False  # the API's final event reached the client (see _FINAL_EVENTS)


@functools.lru_cache(maxsize=256)
def upstream_url(base_url: str, raw_path: str) -> yarl.URL:
    """A backend's URL for a request's path and query as the client sent them (encoded: a
    `%2F` in a query stays one), parsed once: aiohttp would parse the string again for every
    request (~25 us on a cold path). Bounded: odd query strings evict each other."""
    return yarl.URL(base_url + raw_path, encoded=True)


def upstream_headers(client_headers: Mapping[str, str], *, forward_auth: bool) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    named = _connection_options(client_headers)
    for key, value in client_headers.items():
        lower = key.lower()
        if lower in _HOP_BY_HOP or lower in _NOT_FORWARDED or lower in named:
            continue
        if lower in _CLIENT_CREDENTIALS and not forward_auth:
            continue
        headers.add(key, value)
    headers["Accept-Encoding"] = _PLAIN
    return headers


def _connection_options(headers: Mapping[str, str]) -> frozenset[str]:
    """Header names listed in Connection: they describe this hop only (RFC 9110 7.6.1)."""
    values = [value for key, value in headers.items() if key.lower() == "connection"]
    return frozenset(
        name.strip().lower() for value in values for name in value.split(",") if name.strip()
    )


def client_headers(upstream: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in upstream.items():
        if key.lower() not in _HOP_BY_HOP and key.lower() not in ("date", "server"):
            headers.add(key, value)
    headers.update(extra)
    return headers


async def open_upstream(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    body: bytes,
    headers: CIMultiDict[str],
    timeouts: Timeouts,
    method: str = "POST",
) -> aiohttp.ClientResponse:
    """Send the request and wait for the response head; raise UpstreamUnavailable if it fails.

    A request the backend dropped unanswered on a pooled connection (ServerDisconnectedError:
    it closed the connection as it went idle, while a late event loop still took it for fresh;
    supervisor.connections) is sent once more at once, on a new connection, as browsers do: it
    never reached the backend, and waiting for that healthy process to be rechecked held it for
    seconds."""
    for resend in (False, True):
        try:
            response = await session.request(
                method, url, data=body or None, headers=headers, timeout=timeouts.until_first_byte
            )
            break
        except aiohttp.ServerDisconnectedError as exc:
            if resend:
                raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except _UPSTREAM_ERRORS as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
    if response.status in _RETRYABLE_STATUS:
        response.close()
        raise UpstreamUnavailable(f"backend answered {response.status}")
    return response


async def relay_body(
    request: web.Request,
    response: aiohttp.ClientResponse,
    headers: Mapping[str, str],
    timeouts: Timeouts,
) -> tuple[web.StreamResponse, Relayed]:
    """Relay a complete (non-stream) answer. Up to `KeptBody.WHOLE` bytes it is read whole
    first and returned unsent, as a web.Response (an error gets the API's shape from the
    middleware; a backend that fails or stalls before its end may be retried elsewhere:
    UpstreamUnavailable). A larger one is relayed as it comes from there on, never held whole:
    `Relayed.body` keeps only what the telemetry reads (`KeptBody`), and a failure past that
    point cuts the client's connection (a short body, never one that looks complete)."""
    _set_read_timeout(response, timeouts.idle_s)
    read = response.content.readany
    kept = KeptBody()
    try:  # nothing reached the client yet: a failure here may be retried elsewhere
        while (chunk := await read()) and kept.feed(chunk):
            pass
    except _UPSTREAM_ERRORS as exc:
        raise UpstreamUnavailable(f"body lost: {type(exc).__name__}: {exc}") from exc
    out_headers = client_headers(response.headers, headers)
    if not chunk:  # the whole answer is here
        body, status = kept.result(), response.status
        if (refusal := template_refusal(status, body)) is not None:
            body, status = refusal, TEMPLATE_REFUSAL_STATUS  # the client's error, not a fault
        whole = web.Response(status=status, body=body, headers=out_headers)
        return whole, Relayed(status=status, streamed=False, body=body)
    out = web.StreamResponse(status=response.status, headers=out_headers)
    if response.content_length is not None:
        out.content_length = response.content_length  # the client sees a plain body, as sent
    relayed = Relayed(status=response.status, streamed=False)
    send_s = timeouts.send_s
    await sent(request, out.prepare(request), send_s)
    await sent(request, out.write(kept.held()), send_s)
    while True:
        try:
            chunk = await read()
        except _UPSTREAM_ERRORS as exc:
            relayed.upstream_error = f"{type(exc).__name__}: {exc}"
            relayed.body = kept.result()
            if request.transport is not None:
                request.transport.abort()  # a short body, never one that looks complete
            return out, relayed
        if not chunk:
            break
        kept.feed(chunk)
        await sent(request, out.write(chunk), send_s)
    await sent(request, out.write_eof(), send_s)
    relayed.body = kept.result()
    return out, relayed


class KeptBody:
    """What the proxy keeps of a complete answer: the whole body up to `WHOLE` bytes (every
    answer but the huge ones), relayed once complete; past that, only the last `TAIL` bytes,
    where llama-server writes its top-level `timings` and `usage` (its JSON keys come sorted:
    they follow `choices`, `content`, `output`), and from them a small document of those two
    alone for the telemetry (`telemetry.parse_body`). Memory per answer: at most WHOLE + TAIL,
    whatever its size."""

    WHOLE = 1 << 20
    TAIL = 64 * 1024
    _KEYS = (b'"timings"', b'"usage"')

    __slots__ = ("_parts", "_size", "_tail")

    def __init__(self) -> None:
        self._parts: list[bytes] | None = []
        self._size = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> bool:
        """Keep what is needed of `chunk`; False once the body is past WHOLE: `held` then
        gives what was held until then, and only the tail is kept from there on (from the
        next chunk on, if `held` was not called)."""
        if self._parts is not None and self._size > self.WHOLE:
            self.held()
        self._size += len(chunk)
        if self._parts is not None:
            self._parts.append(chunk)
            return self._size <= self.WHOLE
        self._tail = (self._tail + chunk)[-self.TAIL :]
        return False

    def held(self) -> bytes:
        """The body held whole so far, given up: only its tail is kept from now on."""
        data = b"".join(self._parts or ())
        self._parts = None
        self._tail = data[-self.TAIL :]
        return data

    def result(self) -> bytes:
        if self._parts is not None:
            return b"".join(self._parts)
        found = [
            key + b":" + value
            for key in self._KEYS
            if (value := _last_object_of(self._tail, key)) is not None
        ]
        return b"{" + b",".join(found) + b"}"


def _last_object_of(data: bytes, key: bytes) -> bytes | None:
    """The JSON object that follows the last `key` (a quoted member name) in `data`, as bytes,
    or None. Text that mentions the key cannot match: inside a JSON string its quotes are
    escaped."""
    at = len(data)
    while (at := data.rfind(key, 0, at)) >= 0:
        after = data[at + len(key) :].lstrip()
        if after.startswith(b":"):
            end = _object_end(value := after[1:].lstrip())
            if end is not None:
                return value[:end]
    return None


def _object_end(data: bytes) -> int | None:
    """The length of the JSON object at the start of `data`, or None if it is not one."""
    if not data.startswith(b"{"):
        return None
    depth, in_string, escaped = 0, False, False
    for i, byte in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x7B:  # {
            depth += 1
        elif byte == 0x7D:  # }
            depth -= 1
            if depth == 0:
                return i + 1
    return None


async def sent(request: web.Request, writing: Awaitable[object], send_s: float) -> None:
    """Await a write to the client, at most `send_s`: past it the client has read nothing for
    that long (the write waits while the socket's buffers are full), so its connection is cut
    and SendTimedOut raised (nginx's send_timeout)."""
    try:
        async with asyncio.timeout(send_s):
            await writing
    except TimeoutError:
        guard = request.app.get(CONNECTIONS)
        if guard is not None:
            guard.send_timed_out(request)
        elif request.transport is not None:
            request.transport.abort()
        raise SendTimedOut(f"the client read nothing of its answer for {send_s:g} s") from None


async def relay_stream(
    request: web.Request,
    response: aiohttp.ClientResponse,
    headers: Mapping[str, str],
    *,
    api: str,
    sink: ChunkSink,
    timeouts: Timeouts,
    relayed: Relayed | None = None,
    rewriter: ChunkRewriter | None = None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> tuple[web.StreamResponse, Relayed]:
    """Relay an SSE stream chunk by chunk, flushing each one; end with an error event on failure.

    `relayed` (the caller's, so it can still read it if the client leaves mid-relay) records how
    it went; `rewriter`, if any, completes the events on their way (proxy.serving.responses_events);
    `on_chunk`, if any, sees each chunk from the backend as it arrives (the first is its first
    token: the request's prompt has been processed).
    """
    out = web.StreamResponse(
        status=response.status, headers=client_headers(response.headers, headers)
    )
    if relayed is None:
        relayed = Relayed(status=response.status, streamed=True)
    final = FinalEventWatch(api)
    send_s = timeouts.send_s
    _set_read_timeout(response, timeouts.idle_s)
    await sent(request, out.prepare(request), send_s)
    read = response.content.readany
    while True:
        try:
            chunk = await read()
        except _UPSTREAM_ERRORS as exc:
            relayed.upstream_error = f"{type(exc).__name__}: {exc}"
            await sent(request, out.write(stream_error_event(api, _MID_STREAM)), send_s)
            break
        if not chunk:
            if rewriter is not None and (rest := rewriter.flush()):
                await sent(request, out.write(rest), send_s)
            break
        now = time.perf_counter()
        if relayed.first_chunk_at is None:
            relayed.first_chunk_at = now
        if on_chunk is not None:
            on_chunk(chunk)
        relayed.last_chunk_at = now
        relayed.chunks += 1
        sink.feed(chunk, now)
        if rewriter is not None:
            chunk = rewriter.feed(chunk)
        await sent(request, out.write(chunk), send_s)
        if not relayed.final_relayed and final.seen_in(chunk):
            relayed.final_relayed = True
            request[ANSWER_COMPLETE] = True
    await sent(request, out.write_eof(), send_s)
    return out, relayed


_MID_STREAM = "the backend failed mid-stream"


class FinalEventWatch:
    """Whether a stream's final event went by, at one byte search per chunk (plus the seam
    between two chunks, where a marker may be cut in two)."""

    __slots__ = ("_markers", "_seam", "_tail")

    def __init__(self, api: str) -> None:
        self._markers = _FINAL_EVENTS.get(api, ())
        self._seam = max((len(m) for m in self._markers), default=1) - 1
        self._tail = b""

    def seen_in(self, chunk: bytes) -> bool:
        for marker in self._markers:
            if marker in chunk:
                return True
        if not self._seam:
            return False
        seam = self._tail + chunk[: self._seam]
        tail = chunk if len(chunk) >= self._seam else self._tail + chunk
        self._tail = tail[-self._seam :]
        return any(marker in seam for marker in self._markers)


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.content_type == "text/event-stream"


def _set_read_timeout(response: aiohttp.ClientResponse, seconds: float) -> None:
    # The first byte may take minutes (prefill of a long prompt); after it, silence between
    # chunks means a hung backend, so the read timeout is tightened to the idle limit. The
    # timer running is restarted with it: aiohttp only reschedules it when bytes arrive, so a
    # backend whose last bytes came with the head stalled under first_byte_s (10 minutes).
    connection = response.connection
    if connection is not None and connection.protocol is not None:
        connection.protocol.read_timeout = seconds
        connection.protocol.start_timeout()

"""Client connections: a cap, a header-read deadline, and half-closes handled like nginx does.

aiohttp closes idle keep-alive connections (`keepalive_timeout`) but has no deadline for reading
a request head and no limit on connections: slowloris clients and idle floods would otherwise
hold sockets forever and use up the file descriptors the proxy needs to reach its backends.

Each accepted connection's protocol (aiohttp's request handler) is wrapped by `_Guarded`, which
reports bytes, half-closes and the end of the connection to `ConnectionGuard`. The app's
`track_requests` middleware tells it when a request is being handled, so the guard knows which
connections are idle (waiting for a request) and which are not. It then:

- closes a connection whose request head is not complete `header_timeout_s` after its first
  byte (nginx's client_header_timeout; body reads have their own deadline, proxy.serving.body);
- keeps at most `cap` connections: one more closes the connection that has waited longest,
  either without a request in progress (idle) or reading its request body (proxy.serving.body
  marks it: a client that holds a body half-sent holds nothing of the proxy's). Longest by the
  time it entered that state: a new client is the youngest of all, so abusers that reconnect at
  once push out each other, not it. When every connection is busy answering, the new one is
  refused with a 503. The cap leaves file descriptors in reserve for backends, child pipes and
  files;
- lets a client that half-closes (SHUT_WR) after sending its request still read the answer,
  then closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import cast

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge

_REFUSED_BODY = (
    b'{"error": {"message": "too many open connections", "type": "unavailable_error", '
    b'"param": null, "code": null}}'
)
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_REFUSED_BODY), _REFUSED_BODY)
)
ANSWER_COMPLETE = "mtp_proxy.answer_complete"
"""Request key the relay sets once the API's final event (``[DONE]``, ``message_stop``,
``response.completed``) reached the client: a FIN after it needs no answer any more."""
_HALF_CLOSE_GRACE_S = 1.0  # a half-closed connection with no request handled by then is closed
_MIN_CAP = 16
CLOSE_CAUSES = (
    "header_timeout",
    "over_cap_idlest",
    "over_cap_reading",
    "over_cap_refused",
    "half_closed",
    "send_timeout",
)
# How aiohttp's request handler queues a parse error (private: if a release renames it, a broken
# chunk is answered by the body read deadline, 408, instead of at once, 400).
_PARSE_ERROR: type | None = getattr(web_protocol, "_ErrInfo", None)
_RESET_CHECK_S = 0.05  # a reset from loopback or a LAN is back by then; the sweep checks on
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


class ListenError(Exception):
    """The listening socket cannot be bound (port in use, no permission, bad address)."""


def bind_listener(host: str, port: int, backlog: int) -> socket.socket:
    """Bind and listen now, before any backend is spawned: a port in use fails fast."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve listen address {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def connection_cap(max_connections: int, fd_reserve: int) -> int:
    """The cap: `max_connections`, or (0) the open-file limit less `fd_reserve` descriptors.

    The soft open-file limit is raised to the hard one first (as nginx's
    worker_rlimit_nofile would); at least half the limit is always usable for clients."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    auto = max(soft - fd_reserve, soft // 2, _MIN_CAP)
    return min(max_connections, auto) if max_connections > 0 else auto


class _Connection:
    __slots__ = ("busy", "eof_at", "first_byte_at", "protocol", "request", "since", "transport")

    def __init__(
        self, transport: asyncio.Transport, protocol: asyncio.BaseProtocol, now: float
    ) -> None:
        self.transport = transport
        self.protocol = protocol  # aiohttp's request handler for the connection
        self.since = now  # when it became idle, or began reading its body: its eviction age
        self.busy = 0  # requests being handled on this connection
        self.first_byte_at: float | None = None  # of the request head being read, if any
        self.eof_at: float | None = None  # when the client half-closed
        self.request: web.BaseRequest | None = None  # the one being handled


class ConnectionGuard:
    def __init__(self, cap: int, header_timeout_s: float, registry: CollectorRegistry) -> None:
        self.cap = cap
        self.header_timeout_s = header_timeout_s
        self._open: dict[asyncio.Transport, _Connection] = {}
        # Connections without a request in progress, longest waiting first.
        self._idle: OrderedDict[asyncio.Transport, _Connection] = OrderedDict()
        # Busy connections whose handler is reading the request body, longest reading first.
        self._reading: OrderedDict[asyncio.Transport, _Connection] = OrderedDict()
        # Busy connections whose client sent FIN: gone entirely, or only done sending?
        self._after_fin: dict[asyncio.Transport, _Connection] = {}
        self._closed = Counter(
            "mtp_proxy_client_connections_closed",
            "Client connections the proxy closed or refused, by cause.",
            ["cause"],
            registry=registry,
        )
        for cause in CLOSE_CAUSES:
            self._closed.labels(cause)
        gauge = Gauge(
            "mtp_proxy_client_connections",
            "Client connections open now.",
            registry=registry,
        )
        gauge.set_function(lambda: len(self._open))
        reading = Gauge(
            "mtp_proxy_client_connections_reading",
            "Client connections whose request body is being read now.",
            registry=registry,
        )
        reading.set_function(lambda: len(self._reading))

    def protocol_factory(
        self, make: Callable[[], asyncio.BaseProtocol]
    ) -> Callable[[], asyncio.Protocol]:
        def factory() -> asyncio.Protocol:
            return _Guarded(make(), self)

        return factory

    # --- events from the wrapped protocol -------------------------------------------------
    def accept(self, transport: asyncio.Transport, protocol: asyncio.BaseProtocol) -> bool:
        """A new connection; False when it is refused (every other one is busy)."""
        now = asyncio.get_running_loop().time()
        if len(self._open) >= self.cap and not self._make_room():
            self._closed.labels("over_cap_refused").inc()
            transport.write(_REFUSED)
            transport.close()
            return False
        connection = _Connection(transport, protocol, now)
        self._open[transport] = connection
        self._idle[transport] = connection
        return True

    def _make_room(self) -> bool:
        """Close the connection waiting longest, idle or reading its body; False if none is."""
        idlest = next(iter(self._idle.values()), None)
        slowest = next(iter(self._reading.values()), None)
        if idlest is not None and (slowest is None or idlest.since <= slowest.since):
            self._drop(idlest, "over_cap_idlest")
        elif slowest is not None:
            self._drop(slowest, "over_cap_reading")  # its handler is cancelled: 499
        else:
            return False
        return True

    def received(self, transport: asyncio.Transport) -> bool:
        """Bytes arrived; True while a request is being handled on the connection."""
        connection = self._open.get(transport)
        if connection is None:
            return False
        if connection.busy:
            return True
        if connection.first_byte_at is None:
            connection.first_byte_at = asyncio.get_running_loop().time()
        return False

    def half_closed(self, transport: asyncio.Transport) -> bool:
        """The client sent FIN; True keeps the connection open to send the answer."""
        connection = self._open.get(transport)
        if connection is None:
            return False
        if not connection.busy and connection.first_byte_at is None:
            return False  # nothing asked, nothing to answer: close now
        if connection.request is not None and connection.request.get(ANSWER_COMPLETE):
            # The answer is complete (Codex closes right after response.completed): close, so a
            # backend that lingers before ending its stream does not hold the request open.
            return False
        connection.eof_at = asyncio.get_running_loop().time()
        if connection.busy:
            self._ask_with_continue(connection)
        return True

    def lost(self, transport: asyncio.Transport) -> None:
        self._open.pop(transport, None)
        self._idle.pop(transport, None)
        self._reading.pop(transport, None)
        self._after_fin.pop(transport, None)

    @contextlib.contextmanager
    def reading(self, request: web.BaseRequest) -> Iterator[None]:
        """The request's body is being read: until it is, its connection may be closed to make
        room past the cap."""
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is None or transport is None:
            yield
            return
        connection.since = asyncio.get_running_loop().time()
        self._reading[transport] = connection
        try:
            yield
        finally:
            self._reading.pop(transport, None)

    def send_timed_out(self, request: web.BaseRequest) -> None:
        """The client read nothing of its answer for the send deadline: cut the connection
        (proxy.serving.forward), counted here with the other causes."""
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is not None:
            self._drop(connection, "send_timeout", abort=True)
        elif transport is not None:
            transport.abort()

    def framing_failed(self, transport: asyncio.Transport, inner: asyncio.BaseProtocol) -> None:
        """aiohttp's C parser reports a broken body framing (a malformed chunk) as a new error
        message on the connection instead of failing the body being read, which then waits
        forever: fail that body, so its handler answers 400 (proxy.serving.body)."""
        connection = self._open.get(transport)
        messages = getattr(inner, "_messages", None)  # aiohttp's parsed-message queue
        if connection is None or connection.request is None or not messages:
            return
        error = messages[-1][0]
        if _PARSE_ERROR is not None and isinstance(error, _PARSE_ERROR):
            message = str(getattr(error, "message", "broken framing"))
            connection.request.content.set_exception(BadHttpMessage(message))

    def _ask_with_continue(self, connection: _Connection) -> None:
        """A FIN looks the same whether the client only stopped sending (SHUT_WR) or left.
        An interim `100 Continue` (every HTTP/1.1 client skips 1xx answers) tells them apart:
        a client that left answers it with a reset, and the request is then dropped (a
        waiting one frees its place in the queue); one that only half-closed gets its answer."""
        request = connection.request
        if request is None or request.version < (1, 1) or request.writer.output_size:
            return  # HTTP/1.0 (no 1xx allowed), or the answer is on its way: writes will tell
        if connection.transport in self._after_fin:
            return
        connection.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._after_fin[connection.transport] = connection
        asyncio.get_running_loop().call_later(_RESET_CHECK_S, self._check_resets)

    def _check_resets(self) -> None:
        for transport, connection in list(self._after_fin.items()):
            if not connection.busy:
                del self._after_fin[transport]
                continue
            sock = transport.get_extra_info("socket")
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if sock else 0
            if error:  # reset: the client is gone; aborting cancels its handler
                self.lost(transport)
                transport.abort()

    # --- events from the middleware -------------------------------------------------------
    @contextlib.contextmanager
    def handling(self, request: web.BaseRequest) -> Iterator[_Connection | None]:
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is None:
            yield None
            return
        connection.busy += 1
        connection.request = request
        self._idle.pop(connection.transport, None)
        if connection.eof_at is not None:  # the FIN came before the handler started
            self._ask_with_continue(connection)
        try:
            yield connection
        finally:
            connection.request = None
            connection.busy -= 1
            if not connection.busy and connection.transport in self._open:
                connection.first_byte_at = None
                connection.since = asyncio.get_running_loop().time()
                self._idle[connection.transport] = connection

    # --- the deadline sweep ---------------------------------------------------------------
    async def run(self) -> None:
        """Close connections past their deadlines, checking a few times per deadline."""
        interval = min(max(self.header_timeout_s / 4, 0.05), 1.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            self.sweep(loop.time())

    def sweep(self, now: float) -> None:
        self._check_resets()
        for connection in list(self._idle.values()):
            started = connection.first_byte_at
            if started is not None and now - started > self.header_timeout_s:
                self._drop(connection, "header_timeout")
            elif (
                connection.eof_at is not None
                and now - connection.eof_at > _HALF_CLOSE_GRACE_S
                and not pipelined(connection)
            ):
                self._drop(connection, "half_closed")

    def _drop(self, connection: _Connection, reason: str, *, abort: bool = False) -> None:
        """Close a connection; `abort` resets it, dropping what is still unsent (as nginx's
        reset_timedout_connection): a plain close of a socket whose client reads nothing
        leaves the kernel sending the rest, and the client never sees the end."""
        self._closed.labels(reason).inc()
        self.lost(connection.transport)
        if not abort:
            connection.transport.close()
            return
        sock = connection.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        connection.transport.abort()


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard told what happens on it."""

    __slots__ = ("_guard", "_inner", "_made", "_transport")

    def __init__(self, inner: asyncio.BaseProtocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._made = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        if self._guard.accept(self._transport, self._inner):
            self._made = True
            self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._made:
            return
        assert self._transport is not None
        busy = self._guard.received(self._transport)
        self._inner.data_received(data)  # type: ignore[attr-defined]
        if busy:
            self._guard.framing_failed(self._transport, self._inner)

    def eof_received(self) -> bool | None:
        if not self._made or self._transport is None:
            return None
        return self._guard.half_closed(self._transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._guard.lost(self._transport)
        if self._made:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._made:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._made:
            self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """Serves the runner on an already bound socket, every connection under the guard."""

    __slots__ = ("_guard", "_sock")

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard, backlog: int
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._sock = sock
        self._guard = guard

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server), sock=self._sock, backlog=self._backlog
        )


CONNECTIONS = web.AppKey("connections", ConnectionGuard)


@contextlib.contextmanager
def reading(request: web.Request) -> Iterator[None]:
    """Mark the request's connection as reading its body (see ConnectionGuard.reading)."""
    guard = request.app.get(CONNECTIONS)
    if guard is None:
        yield
        return
    with guard.reading(request):
        yield


@web.middleware
async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks the connection busy while its request is handled; after a half-close the
    connection is closed once the answer has gone out."""
    guard = request.app.get(CONNECTIONS)
    if guard is None:
        return await handler(request)
    with guard.handling(request) as conn:
        response = await handler(request)
        if conn is not None and conn.eof_at is not None and not pipelined(conn):
            response.force_close()  # the last request before the client's FIN: answered, done
        return response


def pipelined(connection: _Connection) -> bool:
    """Whether requests the client sent before its FIN are still queued on the connection
    (pipelining): each gets its answer before the connection closes. aiohttp keeps them in its
    handler's message queue (private: without it, the connection closes after the current one)."""
    return bool(getattr(connection.protocol, "_messages", None))

"""Middlewares: client authentication and errors in the called API's own shape."""

from __future__ import annotations

import hmac
import time

import structlog
from aiohttp import web

from proxy.apis import API_OF_PATH, Dialect, dialect_of_path
from proxy.compat.overflow import canonical_overflow
from proxy.serving.errors import error_response, reshaped_error_body
from proxy.serving.handlers import Handler, answer_and_close, refuse
from proxy.serving.passthrough import FORWARDED_POST
from proxy.state import STATE

log = structlog.get_logger("proxy")

# Paths any client may reach without a key: health checks and scrapes (the listener is loopback by
# default; put /metrics behind the network, not behind a client key).
# The live page's files (/ui, /ui/...) hold no data: it reads /admin/* with the admin key.
OPEN_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/ui"})
OPEN_PREFIXES = ("/ui/",)
_OWN_KEY_PREFIXES = ("/admin/",)  # the admin key guards /admin/* itself
_LINGER_BYTES = 64 * 1024  # refused bodies up to this size are read (and dropped) as usual
# Forwarded answers whose errors get the called API's envelope, like the generation routes'.
_RESHAPED_PATHS = frozenset(API_OF_PATH) | frozenset(FORWARDED_POST)


def presented_key(request: web.Request) -> bytes | None:
    """The client's key, from `Authorization: Bearer` (OpenAI SDK) or `x-api-key` (Anthropic),
    as the bytes sent."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return header_bytes(token.strip())
    key = request.headers.get("x-api-key")
    return header_bytes(key) if key else None


def header_bytes(value: str) -> bytes:
    """A header's value as the bytes the client sent: aiohttp decodes bytes that are not UTF-8
    as surrogate escapes, which a plain ``encode()`` refuses (a key header of such bytes was a
    500 and a traceback)."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder makes: any bytes will do, none match
        return value.encode("utf-8", "surrogatepass")


def key_matches(presented: bytes, keys: list[str]) -> bool:
    # Compare bytes against every key, always: the time taken says nothing about which key was
    # close, and a key that is not UTF-8 is just another wrong one.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented, key.encode())
    return matched


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    received = time.perf_counter()
    keys = request.app[STATE].settings.server.api_keys
    if (
        not keys
        or request.path in OPEN_PATHS
        or request.path.startswith(OPEN_PREFIXES + _OWN_KEY_PREFIXES)
    ):
        return await handler(request)
    presented = presented_key(request)
    if presented is None or not key_matches(presented, [k.get_secret_value() for k in keys]):
        message = "invalid or missing API key"
        api = API_OF_PATH.get(request.path)
        if api is not None:  # a generation request: counted and logged like every other
            response = refuse(request, api, 401, message, received, code="invalid_api_key")
        else:
            dialect = dialect_of_path(request.path)
            response = error_response(dialect, 401, message, code="invalid_api_key")
        if _large_unread_body(request):
            # Reading it only to discard it (aiohttp lingers up to 10 s) would let anyone
            # without a key make the proxy move their megabytes: answer and close instead.
            await answer_and_close(request, response)
        return response
    return await handler(request)


def _large_unread_body(request: web.Request) -> bool:
    length = request.content_length
    return (length is None and request.can_read_body) or (length or 0) > _LINGER_BYTES


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = dialect_of_path(request.path)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = (
            exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        )
        return error_response(dialect, exc.status, message)
    except ConnectionError:
        raise  # the client went away: nobody is left to answer
    except Exception:
        log.exception("unhandled_error", path=request.path, method=request.method)
        if request.writer is not None and request.writer.output_size:
            # Part of the answer is out: an error answer now would write a second HTTP head
            # into its body. Cut the connection instead: the client sees a broken answer.
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("answer cut: internal error after it began") from None
        return error_response(dialect, 500, "internal error in mtp-proxy")
    reshape = request.path in _RESHAPED_PATHS
    if response.status < 400 or not isinstance(response, web.Response) or not reshape:
        return response
    if not _canonical_overflow(request, response):
        _reshape_error(response, dialect)  # only relayed backend answers; /health keeps its own
    return response


def _canonical_overflow(request: web.Request, response: web.Response) -> bool:
    """A context overflow gets the canonical error of the API called (proxy.compat.overflow)."""
    api = API_OF_PATH.get(request.path)
    body = response.body
    if response.status != 400 or api is None or not isinstance(body, bytes):
        return False
    if not request.app[STATE].settings.compat.context_overflow_errors:
        return False
    canonical = canonical_overflow(api, body)
    if canonical is None:
        return False
    response.body = canonical
    response.content_type = "application/json"
    return True


def _reshape_error(response: web.Response, dialect: Dialect) -> None:
    """A relayed backend error gets the envelope of the API the client called."""
    body = response.body
    if not isinstance(body, bytes):
        return
    reshaped = reshaped_error_body(dialect, response.status, body)
    if reshaped is not None:
        response.body = reshaped
        response.content_type = "application/json"

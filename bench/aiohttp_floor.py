"""The floor: the least an aiohttp reverse proxy can do, as a reference path for bench.overhead.

It reads the request, posts it upstream on a pooled aiohttp client and relays the answer (chunk
by chunk for streams): no routing, admission, telemetry, metrics or logging. What mtp-proxy adds
on top of this path is the cost of its own features; what this path adds over talking to the
backend directly is the cost of any proxy built on aiohttp (two more loopback hops, HTTP parsing
twice) on this machine.

    python -m bench.aiohttp_floor --upstream http://127.0.0.1:8081 --port 8090
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

from bench.processes import ServerProcess, start_server

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
_DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection"})


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
    url = request.app[UPSTREAM] + request.path_qs
    async with request.app[SESSION].post(url, data=body, headers=headers) as upstream:
        answer_headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json")}
        if upstream.content_type != "text/event-stream":
            payload = await upstream.read()
            return web.Response(status=upstream.status, body=payload, headers=answer_headers)
        out = web.StreamResponse(status=upstream.status, headers=answer_headers)
        await out.prepare(request)
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def health(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def client_session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0)  # as mtp-proxy: admission, not the pool, limits
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        app[SESSION] = session
        yield


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(client_session)
    app.router.add_post("/{path:.*}", relay)
    app.router.add_get("/health", health)  # for start_server's readiness check
    return app


def start_floor(upstream: str) -> ServerProcess:
    return start_server(["bench.aiohttp_floor", "--upstream", upstream])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(
        make_app(args.upstream),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()

"""A real backend that fails on cue, for the proxy's fault tests.

`python -m tests.support.misbehaving_backend --port P --mode MODE [--chunks N] [--interval S]`
serves just enough of llama-server's API for the proxy: /health (always 200), /metrics, and
streaming or complete answers on the generation paths (OpenAI chunks, Anthropic events). A request
may pick its own behaviour with the header ``X-Misbehave: MODE`` or ``MODE:N``.

Modes:
  ok                    answer normally (N chunks, `interval` s apart)
  hang-before-headers   read the request, then say nothing, ever
  close-before-headers  read the request, then drop the connection
  hang-after-chunks     send N chunks, then say nothing, ever
  close-after-chunks    send N chunks, then drop the connection mid-stream
  flood                 stream `--flood-mb` MB of 64 KiB events as fast as the reader takes them
  echo-headers          answer a complete chat completion whose content is the headers received
  hang-after-final      send N chunks and the API's final event, then never end the stream
  big-body              answer a complete chat completion of about N MiB (N from MODE:N, else
                        `--flood-mb`), usage at its end as llama-server writes it, as fast as read
  stall-mid-body        answer a complete chat completion: its first half, then nothing, ever
  deep-event            stream N chunks, then an event whose data nests 300 levels deep (valid
                        JSON, deeper than orjson writes), then the API's final event
  echo-body             answer a complete chat completion whose content is the body received
  timings               answer a complete chat completion whose `timings` are the JSON object of
                        the header X-Timings (impossible ones too: the proxy must not learn them)
  call-tool             /v1/responses: call the tool the header X-Call-Tool names, with the JSON
                        arguments of X-Call-Arguments, as llama-server words a function call
                        (a 400 if the request's `tools` has no such function)

`--drop-idle-s S` models llama-server's keep-alive: it closes a connection idle 5 s (its answers
say `Keep-Alive: timeout=5`), and a client that sends on it just then loses the request. Here a
request that arrives on a connection idle S s or more is always dropped: the race's outcome, made
certain.

`POST /apply-template` (the chat-template check's route) behaves as a complete (non-stream)
generation. Whatever the mode, every other path (`POST /tokenize`, `GET /props`,
`/v1/embeddings`, anything) answers the method and path (with its query) it was called with (in
mode echo-headers, its headers and body too), after `X-Echo-Delay` seconds if the request sets
that header. Every request but /health and /metrics is recorded: `GET /recorded` answers the list
(method, path with query) and the most requests seen at once per path, so tests can tell what
reached the backend and how many at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bench.processes import free_port

MODES = frozenset(
    {
        "ok",
        "hang-before-headers",
        "close-before-headers",
        "hang-after-chunks",
        "close-after-chunks",
        "flood",
        "echo-headers",
        "hang-after-final",
        "big-body",
        "stall-mid-body",
        "deep-event",
        "echo-body",
        "call-tool",
        "timings",
    }
)
_FOREVER_S = 3600.0


@dataclass(frozen=True)
class Behaviour:
    mode: str
    chunks: int
    interval_s: float
    flood_mb: int


BEHAVIOUR = web.AppKey("behaviour", Behaviour)


@dataclass
class Recording:
    """What reached this backend: (method, path with query) of each request, in order, and the
    most requests in progress at once per path."""

    requests: list[tuple[str, str]]
    now: dict[str, int]
    most: dict[str, int]


RECORDING = web.AppKey("recording", Recording)
DROP_IDLE_S = web.AppKey("drop_idle_s", float)
ANSWERED_AT = web.AppKey("answered_at", dict[object, float])  # connection -> its last answer
_UNRECORDED = frozenset({"/health", "/metrics", "/recorded"})


@web.middleware
async def _record(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path in _UNRECORDED:
        return await handler(request)
    seen = request.app[RECORDING]
    seen.requests.append((request.method, request.raw_path))
    seen.now[request.path] = now = seen.now.get(request.path, 0) + 1
    seen.most[request.path] = max(seen.most.get(request.path, 0), now)
    try:
        return await handler(request)
    finally:
        seen.now[request.path] -= 1


@web.middleware
async def _drop_stale(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    limit = request.app[DROP_IDLE_S]
    if not limit or request.transport is None:
        return await handler(request)
    connection = request.transport.get_extra_info("peername")  # the client's address and port
    answered = request.app[ANSWERED_AT]
    last = answered.get(connection)
    if last is not None and time.monotonic() - last >= limit:
        _drop(request)
        return web.Response(status=500)  # never sent: the connection is gone
    try:
        return await handler(request)
    finally:
        answered[connection] = time.monotonic()


async def recorded(request: web.Request) -> web.Response:
    seen = request.app[RECORDING]
    return web.json_response({"requests": seen.requests, "most_at_once": seen.most})


def _behaviour(request: web.Request) -> Behaviour:
    default = request.app[BEHAVIOUR]
    asked = request.headers.get("X-Misbehave")
    if not asked:
        return default
    mode, _, count = asked.partition(":")
    if mode not in MODES:
        raise web.HTTPBadRequest(text=f"unknown mode {mode!r}")
    chunks = int(count) if count.isdigit() else default.chunks
    return Behaviour(mode, chunks, default.interval_s, default.flood_mb)


def _chat_chunk(text: str) -> bytes:
    delta = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {json.dumps(delta)}\n\n".encode()


def _completion_chunk(text: str) -> bytes:
    chunk = {"object": "text_completion", "choices": [{"index": 0, "text": text}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _responses_chunk(text: str) -> bytes:
    event = {"type": "response.output_text.delta", "output_index": 0, "delta": text}
    return f"event: response.output_text.delta\ndata: {json.dumps(event)}\n\n".encode()


def _anthropic_chunk(text: str) -> bytes:
    event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return f"event: content_block_delta\ndata: {json.dumps(event)}\n\n".encode()


def _sse(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _stream_head(api: str) -> bytes:
    if api == "responses":
        response = {"id": "resp_test", "object": "response", "status": "in_progress"}
        return _sse("response.created", {"type": "response.created", "response": response})
    if api != "messages":
        return b""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "misbehaving",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        },
    }
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    return _sse("message_start", start) + _sse("content_block_start", block)


def _stream_tail(api: str) -> bytes:
    if api == "messages":
        return _sse("message_stop", {"type": "message_stop"})
    if api == "responses":
        # 8 output tokens: enough for the proxy to learn a decode speed from the answer.
        usage = {"input_tokens": 1, "output_tokens": 8, "total_tokens": 9}
        response = {"id": "resp_test", "object": "response", "status": "completed", "usage": usage}
        return _sse("response.completed", {"type": "response.completed", "response": response})
    return b"data: [DONE]\n\n"


_APIS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}
# Each API's own stream chunks.
_CHUNKS = {
    "chat": _chat_chunk,
    "completions": _completion_chunk,
    "responses": _responses_chunk,
    "messages": _anthropic_chunk,
}


async def generate(request: web.Request) -> web.StreamResponse:
    behaviour = _behaviour(request)
    body = await request.json()
    if behaviour.mode == "hang-before-headers":
        await asyncio.sleep(_FOREVER_S)
    if behaviour.mode == "close-before-headers":
        _drop(request)
        return web.Response(status=500)  # never sent: the connection is gone
    if behaviour.mode == "echo-headers":
        return _echo(request)
    if behaviour.mode in ("big-body", "stall-mid-body"):
        return await _big_body(request, behaviour)
    if behaviour.mode == "echo-body":
        await asyncio.sleep(behaviour.interval_s)  # a request in flight for that long
        return web.json_response(_complete_body((await request.read()).decode()))
    if behaviour.mode == "call-tool":
        return await _call_tool(request, body)
    if behaviour.mode == "timings":
        timings = json.loads(request.headers.get("X-Timings", "{}"))
        return web.json_response({**_complete_body("done"), "timings": timings})
    if not isinstance(body, dict) or not body.get("stream"):
        return web.json_response(_complete_body("done"))
    return await _stream(request, behaviour, api=_APIS[request.path])


async def _stream(request: web.Request, behaviour: Behaviour, *, api: str) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    try:
        await _chunks(out, behaviour, api)
    except ConnectionError:
        return out  # the proxy went away (its client did): nothing left to send
    if behaviour.mode == "hang-after-chunks":
        await asyncio.sleep(_FOREVER_S)
    if behaviour.mode == "close-after-chunks":
        _drop(request)
        return out
    await out.write(_stream_tail(api))
    if behaviour.mode == "hang-after-final":
        await asyncio.sleep(_FOREVER_S)  # the answer is complete; the stream never ends
    await out.write_eof()
    return out


async def _chunks(out: web.StreamResponse, behaviour: Behaviour, api: str) -> None:
    await out.write(_stream_head(api))
    chunk = _CHUNKS.get(api, _chat_chunk)
    if behaviour.mode == "flood":
        await _flood(out, behaviour.flood_mb, chunk)
        return
    for i in range(behaviour.chunks):
        await out.write(chunk(f"token{i} "))
        await asyncio.sleep(behaviour.interval_s)
    if behaviour.mode == "deep-event":
        await out.write(DEEP_EVENT)


DEEP = "[" * 300 + "]" * 300
DEEP_EVENT = (
    "event: response.output_text.delta\n"
    f'data: {{"type":"response.output_text.delta","delta":"","nested":{DEEP}}}\n\n'
).encode()


async def _flood(
    out: web.StreamResponse, megabytes: int, make_chunk: Callable[[str], bytes]
) -> None:
    chunk = make_chunk("x" * 65_000)
    for _ in range(megabytes * 1024 * 1024 // len(chunk)):
        await out.write(chunk)  # write() waits while the reader is behind: we follow its pace


async def _big_body(request: web.Request, behaviour: Behaviour) -> web.StreamResponse:
    """A complete answer of `chunks` MiB (big-body), or half of a small one then silence
    (stall-mid-body); Content-Length set, as llama-server sends it."""
    usage = b',"usage":{"completion_tokens":7,"prompt_tokens":5,"total_tokens":12}}'
    head = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"'
    size = (behaviour.chunks if behaviour.chunks > 0 else behaviour.flood_mb) << 20
    if behaviour.mode == "stall-mid-body":
        size = 1024
    piece = b"x" * 65536
    out = web.StreamResponse(headers={"Content-Type": "application/json"})
    out.content_length = len(head) + size + len(b'"}}]') + len(usage)
    if behaviour.mode == "stall-mid-body" and request.transport is not None:
        # The HTTP head and the half in one write, so in one packet: no byte comes after the
        # head's, and the proxy's idle deadline must start without one (aiohttp's own writes
        # may send the head alone first, and a later byte restarts the proxy's timer).
        http_head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        http_head += f"Content-Length: {out.content_length}\r\n\r\n"
        request.transport.write(http_head.encode() + head + b"x" * (size // 2))
        await asyncio.sleep(_FOREVER_S)
    await out.prepare(request)
    try:
        await out.write(head)
        for _ in range(size // len(piece)):
            await out.write(piece)  # write() waits while the reader is behind
        await out.write(b"x" * (size % len(piece)) + b'"}}]' + usage)
        await out.write_eof()
    except ConnectionError:
        pass  # the proxy went away
    return out


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _echo(request: web.Request) -> web.Response:
    received = {key: value for key, value in request.headers.items()}
    response = web.json_response(_complete_body(json.dumps(received)))
    # A backend that sets a cookie: the proxy must not replay it on other clients' requests.
    response.set_cookie("backend-session", "from-an-earlier-request")
    return response


async def _call_tool(request: web.Request, body: Any) -> web.StreamResponse:
    """A function call as llama-server's Responses route words it (server-task.cpp): a complete
    answer's output item, or the stream's added / arguments delta / done / completed events."""
    name = request.headers.get("X-Call-Tool", "")
    arguments = request.headers.get("X-Call-Arguments", "{}")
    tools = body.get("tools") if isinstance(body, dict) else None
    names = [
        t.get("name") for t in tools or [] if isinstance(t, dict) and t.get("type") == "function"
    ]
    if name not in names:
        error = {
            "code": 400,
            "message": f"no function tool {name!r}",
            "type": "invalid_request_error",
        }
        return web.json_response({"error": error}, status=400)
    item = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": "call_1",
        "name": name,
    }
    response = {"id": "resp_tool", "object": "response", "status": "completed", "output": [item]}
    if not body.get("stream"):
        return web.json_response(response)
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    added = {**item, "arguments": "", "status": "in_progress"}
    await out.write(
        _sse("response.output_item.added", {"type": "response.output_item.added", "item": added})
    )
    for part in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
        delta = {"type": "response.function_call_arguments.delta", "delta": part, "item_id": "fc_1"}
        await out.write(_sse("response.function_call_arguments.delta", delta))
    await out.write(
        _sse("response.output_item.done", {"type": "response.output_item.done", "item": item})
    )
    await out.write(
        _sse("response.completed", {"type": "response.completed", "response": response})
    )
    await out.write_eof()
    return out


def _complete_body(content: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "misbehaving",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def echo_request(request: web.Request) -> web.Response:
    delay = request.headers.get("X-Echo-Delay")
    if delay:
        await asyncio.sleep(float(delay))
    body = await request.read()
    answer: dict[str, object] = {"method": request.method, "path_qs": request.raw_path}
    if request.app[BEHAVIOUR].mode == "echo-headers":  # and what the request carried
        answer.update(headers=dict(request.headers), body=body.decode("utf-8", "replace"))
    return web.json_response(answer)


async def health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(_request: web.Request) -> web.Response:
    return web.Response(text="", content_type="text/plain")


def make_app(behaviour: Behaviour, drop_idle_s: float = 0.0) -> web.Application:
    app = web.Application(middlewares=[_drop_stale, _record], client_max_size=256 << 20)
    app[BEHAVIOUR] = behaviour
    app[DROP_IDLE_S] = drop_idle_s
    app[ANSWERED_AT] = {}
    app[RECORDING] = Recording([], {}, {})
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/recorded", recorded)
    for path in _APIS:
        app.router.add_post(path, generate)
    # The chat-template check's route (supervisor/template_check.py): it fails as the mode says,
    # and "ok" answers a completion without the rendered prompt llama-server would give.
    app.router.add_post("/apply-template", generate)
    app.router.add_route("*", "/{anything:.*}", echo_request)  # after every named route
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=sorted(MODES), default="ok")
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--flood-mb", type=int, default=256)
    parser.add_argument("--drop-idle-s", type=float, default=0.0)
    args = parser.parse_args()
    behaviour = Behaviour(args.mode, args.chunks, args.interval, args.flood_mb)
    app = make_app(behaviour, args.drop_idle_s)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


@contextmanager
def running_backend(mode: str = "ok", *extra: str) -> Iterator[str]:
    """Run this program on a free loopback port; yields its base URL, stops it afterwards."""
    with backend_process(mode, *extra) as (url, _process):
        yield url


@contextmanager
def backend_process(mode: str = "ok", *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """As running_backend, with the process itself, for tests that kill it on purpose."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.support.misbehaving_backend",
        "--port",
        str(port),
        "--mode",
        mode,
    ]
    process = subprocess.Popen([*argv, *extra], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        yield url, process
    finally:
        process.kill()
        process.wait()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"misbehaving backend exited {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("misbehaving backend did not start")


if __name__ == "__main__":
    main()

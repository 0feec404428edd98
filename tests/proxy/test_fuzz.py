"""Bad input against the running proxy: generated bodies, headers, paths and methods.

Hypothesis (fixed seed) generates over 10,000 requests: malformed JSON, wrong types, missing
fields, invalid UTF-8, lone surrogates, huge numbers, deep nesting, oversized bodies, unknown
paths and methods, odd headers. They go over one keep-alive session to a real proxy whose
simulated backends answer the valid ones (max_tokens stays tiny). Every answer must be below 500,
and every 4xx must be an error in the called API's shape. Header injection that aiohttp's client
refuses to send goes over raw sockets instead.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from tests.support.harness import ProxyProcess, proxy_config, running_proxy, simulator_model

EXAMPLES = 10_500
MAX_BODY = 65_536
API_PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/completions", "/v1/responses"]


@pytest.fixture(scope="module")
def fuzz_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    # A tiny context bounds every answer's length whatever max_tokens says; fast, flat pace.
    model = simulator_model(
        preset="fast",
        time_scale=1000.0,
        slots=8,
        extra_args=["-c", "256"],
        profiles=[{"name": "off"}, {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}],
    )
    config = proxy_config([model], server={"max_body_bytes": MAX_BODY})
    with running_proxy(config, tmp_path_factory.mktemp("fuzz")) as proxy:
        yield proxy


# --- strategies --------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def dumped(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return values.map(lambda v: json.dumps(v).encode())


# Raw JSON fragments JSON encoders never produce but parsers meet.
nasty_fragments = st.sampled_from(
    [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e999",
        b"-1e400",
        b"1" + b"0" * 400 + b".5",
        b"9" * 5000,  # past Python's int-string limit
        b'"\\ud800"',  # lone surrogates
        b'"a\\udfffb"',
        b'"\\ud83d\\ude00"',  # a valid pair
        b'"\\u0000"',
        b'"\xff\xfe"',  # invalid UTF-8
        b'"\xc0\xaf"',  # overlong encoding
        b'"\xed\xa0\x80"',  # an encoded surrogate
        b'"tab\there"',  # raw control character
        b'"\\x41"',  # invalid escape
        b"[" * 3000 + b"]" * 3000,  # deeper than the parser's recursion limit
        b'{"a":' * 800 + b"1" + b"}" * 800,
        b"[" * 90 + b"]" * 90,
        b"01",
        b"tru",
        b"",
    ]
)
deep_nesting = st.integers(min_value=1, max_value=2500).map(lambda d: b"[" * d + b"]" * d)
huge_numbers = st.integers(min_value=1, max_value=6000).map(lambda n: b"9" * n)
any_fragment = dumped(json_values) | nasty_fragments | deep_nesting | huge_numbers

good_chat = [{"role": "user", "content": "hello"}]
FIELDS: dict[str, dict[str, st.SearchStrategy[bytes]]] = {
    "/v1/chat/completions": {
        "messages": dumped(
            st.just(good_chat)
            | st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
                    optional={"content": json_values, "tool_calls": json_values},
                ),
                max_size=3,
            )
        ),
        "max_tokens": dumped(st.integers(min_value=1, max_value=3)),
        "stream": dumped(st.booleans()),
        "tools": dumped(json_values),
    },
    "/v1/messages": {
        "messages": dumped(
            st.just(good_chat)
            | st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant"]), "content": json_values}
                ),
                max_size=3,
            )
        ),
        "max_tokens": dumped(st.integers(min_value=1, max_value=3)),
        "system": dumped(st.text(max_size=20) | json_values),
        "stream": dumped(st.booleans()),
    },
    "/v1/completions": {
        "prompt": dumped(st.text(max_size=40) | json_values),
        "max_tokens": dumped(st.integers(min_value=1, max_value=3)),
        "stream": dumped(st.booleans()),
    },
    "/v1/responses": {
        "input": dumped(st.text(max_size=40) | json_values),
        "max_output_tokens": dumped(st.integers(min_value=1, max_value=3)),
        "instructions": dumped(st.text(max_size=20)),
        "stream": dumped(st.booleans()),
    },
}
models = dumped(st.sampled_from(["mtp-demo", "nope", ""]) | json_values)


@st.composite
def structured_body(draw: st.DrawFn, path: str) -> bytes:
    """A plausible request, each field valid, wrong-typed, nasty or missing."""
    fields = {"model": models, **FIELDS[path]}
    parts = []
    for name, valid in fields.items():
        choice = draw(st.integers(min_value=0, max_value=9))
        if choice == 0:
            continue  # missing
        value = draw(any_fragment) if choice == 1 else draw(valid)
        parts.append(b'"' + name.encode() + b'":' + value)
    if draw(st.booleans()):
        parts.append(draw(dumped(st.text(max_size=10))) + b":" + draw(any_fragment))
    return b"{" + b",".join(parts) + b"}"


def mutated(body: bytes, position: int, junk: bytes, cut: int) -> bytes:
    position %= len(body) + 1
    return body[:position] + junk + body[position + cut :]


bodies_for_path = {
    path: st.one_of(
        structured_body(path),
        structured_body(path),
        structured_body(path),
        structured_body(path),
        any_fragment,
        st.binary(max_size=64),
        st.builds(
            mutated,
            structured_body(path),
            st.integers(min_value=0, max_value=400),
            st.binary(max_size=4),
            st.integers(min_value=0, max_value=3),
        ),
        st.integers(min_value=MAX_BODY - 100, max_value=MAX_BODY + 4096).map(
            lambda n: b'{"model": "mtp-demo", "prompt": "' + b"x" * n + b'"}'
        ),
    )
    for path in API_PATHS
}

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
header_names = st.sampled_from(
    [
        "Content-Type",
        "Accept",
        "Authorization",
        "x-api-key",
        "X-Request-Id",
        "X-MTP-Profile",
        "X-MTP-Session",
        "Content-Encoding",
        "Accept-Encoding",
        "Cookie",
        "X-Forwarded-For",
        "anthropic-version",
        "Origin",
    ]
) | st.text(alphabet=TOKEN, min_size=1, max_size=16).filter(
    # Framing headers are the HTTP client's to set (a Content-Length that disagrees with the body
    # makes the server wait for bytes that never come); raw-socket cases below forge them.
    lambda name: name.lower() not in {"content-length", "transfer-encoding", "host", "connection"}
)
header_values = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from(["\t", "é"]),
    max_size=80,
).map(str.strip)
headers = st.dictionaries(header_names, header_values, max_size=4)
odd_paths = st.sampled_from(
    [
        "/v1/chat/completions/",
        "//v1/messages",
        "/v1/messages?beta=true",
        "/v1/models",
        "/v1/models/mtp-demo",
        "/v1/embeddings",
        "/health",
        "/metrics",
        "/admin/backends",
        "/admin/backends/x/restart",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/v1/chat%2Fcompletions",
        "/" + "a" * 3000,
        "/",
    ]
) | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%/", max_size=40).map(
    lambda p: "/" + p
)
methods = st.sampled_from(
    [
        "POST",
        "POST",
        "POST",
        "GET",
        "PUT",
        "DELETE",
        "PATCH",
        "OPTIONS",
        "HEAD",
        "TRACE",
        "PROPFIND",
    ]
)


@st.composite
def fuzz_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        path, method = draw(odd_paths), draw(methods)
        body = draw(st.binary(max_size=64) | any_fragment)
    else:
        path = draw(st.sampled_from(API_PATHS))
        method = "POST" if draw(st.integers(min_value=0, max_value=19)) else draw(methods)
        body = draw(bodies_for_path[path])
    return method, path, draw(headers), body


# --- checks ------------------------------------------------------------------------------------


def dialect_of(path: str) -> str:
    return (
        "anthropic"
        if path.split("?", maxsplit=1)[0].rstrip("/").endswith("/messages")
        else "openai"
    )


def error_shape_problem(path: str, body: bytes) -> str | None:
    """None when `body` is an error in the shape of the API at `path`, else what is wrong."""
    try:
        error = json.loads(body)
    except ValueError:
        return f"not JSON: {body[:120]!r}"
    if dialect_of(path) == "anthropic":
        ok = (
            isinstance(error, dict)
            and error.get("type") == "error"
            and isinstance(error.get("error"), dict)
            and bool(error["error"].get("type"))
            and bool(error["error"].get("message"))
        )
    else:
        ok = (
            isinstance(error, dict)
            and isinstance(error.get("error"), dict)
            and bool(error["error"].get("message"))
            and bool(error["error"].get("type"))
        )
    return None if ok else f"not the {dialect_of(path)} error shape: {body[:160]!r}"


class Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.statuses: Counter[int] = Counter()
        self.server_errors: list[str] = []
        self.bad_shapes: list[str] = []


async def send(
    session: aiohttp.ClientSession, base: str, request: tuple[str, str, dict[str, str], bytes]
) -> tuple[int, bytes]:
    method, path, header_map, body = request
    url = URL(base + path, encoded=True)
    async with session.request(method, url, data=body, headers=header_map) as response:
        return response.status, await response.read()


def test_generated_requests_never_get_a_5xx(fuzz_proxy: ProxyProcess) -> None:
    loop = asyncio.new_event_loop()
    timeout = aiohttp.ClientTimeout(total=30)
    session = loop.run_until_complete(_session(timeout))
    tally = Tally()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_requests())
    def one(request: tuple[str, str, dict[str, str], bytes]) -> None:
        status, body = loop.run_until_complete(send(session, fuzz_proxy.url, request))
        tally.sent += 1
        tally.statuses[status] += 1
        method, path, _, raw = request
        summary = f"{status} {method} {path[:60]} {raw[:100]!r}"
        if status >= 500:
            tally.server_errors.append(summary)
        if status >= 400 and method != "HEAD" and (problem := error_shape_problem(path, body)):
            tally.bad_shapes.append(f"{summary}: {problem}")

    started = time.perf_counter()
    try:
        one()
    finally:
        loop.run_until_complete(session.close())
        loop.close()
    took = time.perf_counter() - started
    statuses = dict(sorted(tally.statuses.items()))
    print(f"\nfuzz: {tally.sent} requests in {took:.1f} s; statuses {statuses}")
    print(f"fuzz: 5xx {len(tally.server_errors)}, wrong error shapes {len(tally.bad_shapes)}")
    assert tally.sent >= 10_000
    assert tally.server_errors == [], tally.server_errors[:10]
    assert tally.bad_shapes == [], tally.bad_shapes[:10]
    assert_still_serving(fuzz_proxy)


async def _session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=timeout, auto_decompress=False, skip_auto_headers=["User-Agent"]
    )


def assert_still_serving(proxy: ProxyProcess, since: int = 0) -> None:
    """Alive, no traceback from the proxy's own code in the log (after line `since`; aiohttp
    also logs the malformed HTTP it refuses), and a valid request still answered."""
    assert proxy.process.poll() is None, "the proxy died"
    tracebacks = [
        line
        for line in proxy.log_lines()[since:]
        if line.get("event") == "unhandled_error" or "/proxy/" in line.get("exception", "")
    ]
    assert tracebacks == [], tracebacks[:3]
    body = {"model": "mtp-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    raw = json.dumps(body).encode()
    status, answer = raw_request(
        proxy,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(raw)
        + raw,
    )
    assert status == 200, answer
    assert json.loads(answer)["choices"][0]["message"]["content"]


# --- header injection over raw sockets ---------------------------------------------------------


def raw_request(proxy: ProxyProcess, data: bytes) -> tuple[int, bytes]:
    """Send bytes as they are; return the status and body (0 if the proxy just closed)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    if not received:
        return 0, b""
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    return status, body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


OK_BODY = b'{"model": "mtp-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
# Each with the exact answer expected: aiohttp's parser refuses all but one before any handler
# runs (a plain-text 400 naming the fault). The "smuggled" request ends the header block early:
# what the proxy sees is a POST without a body, refused by the handler in the OpenAI shape, then
# a pipelined GET of an admin path, answered 401 (no admin key).
INJECTIONS: dict[str, tuple[bytes, int]] = {
    "crlf in a header value": (b"X-Request-Id: abc\r\nX-Injected: 1\rfoo\r\n", 400),
    "bare LF line": (b"X-A: 1\nX-B: 2\r\n", 400),
    "line without a colon": (b"X-Request-Id abc\r\n", 400),
    "obs-fold continuation": (b"X-A: 1\r\n  folded\r\n", 400),
    "NUL in a header value": (b"X-A: a\x00b\r\n", 400),
    "space before the colon": (b"X-A : 1\r\n", 400),
    "two Content-Lengths": (b"Content-Length: 5\r\n", 400),
    "Content-Length with Transfer-Encoding": (b"Transfer-Encoding: chunked\r\n", 400),
    "oversized header": (b"X-Big: " + b"a" * 20_000 + b"\r\n", 400),
    "too many headers": (b"".join(b"X-H%d: v\r\n" % i for i in range(200)), 400),
    "non-ASCII header name": (b"X-\xc3\xa9: 1\r\n", 400),
    "smuggled request in a value": (
        b"X-A: 1\r\n\r\nGET /admin/backends HTTP/1.1\r\nHost: x\r\n",
        400,
    ),
    "invalid Content-Length": (b"Content-Length: -1\r\n", 400),
}
# Request lines aiohttp's parser refuses before any handler runs (a plain-text 400), or reads
# leniently: without a version it is an HTTP/1.0 request, otherwise valid, and is served.
BAD_REQUEST_LINES: dict[str, tuple[bytes, int]] = {
    "unknown method": (b"FROB /v1/chat/completions HTTP/1.1\r\n", 400),
    "space in the path": (b"POST /v1/chat completions HTTP/1.1\r\n", 400),
    "no HTTP version": (b"POST /v1/chat/completions\r\n", 200),
    "HTTP/2 preface": (b"PRI * HTTP/2.0\r\n", 400),
    "CR in the path": (b"POST /v1/chat/completions\rX HTTP/1.1\r\n", 400),
}


@pytest.mark.parametrize("name", sorted(BAD_REQUEST_LINES))
def test_malformed_request_lines_get_their_exact_status(
    fuzz_proxy: ProxyProcess, name: str
) -> None:
    since = len(fuzz_proxy.log_lines())
    line, expected = BAD_REQUEST_LINES[name]
    head = line + b"Host: x\r\nContent-Type: application/json\r\n"
    length = b"Content-Length: %d\r\n" % len(OK_BODY)
    status, body = raw_request(fuzz_proxy, head + length + b"Connection: close\r\n\r\n" + OK_BODY)
    assert status == expected, (status, body[:300])
    if expected == 200:
        assert json.loads(body)["choices"][0]["message"]["content"]
    else:
        assert body and b"Traceback" not in body
    assert_still_serving(fuzz_proxy, since)


@pytest.mark.parametrize("name", sorted(INJECTIONS))
def test_header_injection_is_refused_with_a_400(fuzz_proxy: ProxyProcess, name: str) -> None:
    since = len(fuzz_proxy.log_lines())
    injected, expected = INJECTIONS[name]
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    length = b"Content-Length: %d\r\n" % len(OK_BODY)
    status, body = raw_request(
        fuzz_proxy, head + injected + length + b"Connection: close\r\n\r\n" + OK_BODY
    )
    assert status == expected, (status, body[:300])
    assert body and b"Traceback" not in body
    if name == "smuggled request in a value":
        # Nothing is smuggled on a direct connection: the blank line ends the first request (a
        # POST without a body: 400) and the rest is a second, pipelined request, answered on its
        # own and refused like any other without the admin key.
        assert body.count(b"HTTP/1.1 ") == 1 and b"HTTP/1.1 401 " in body
        assert b"authentication_error" in body
    else:
        assert b"HTTP/1.1 " not in body  # one answer
    assert_still_serving(fuzz_proxy, since)

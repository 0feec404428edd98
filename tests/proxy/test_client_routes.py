"""What agent CLIs and llama-server users call besides the four generation routes, on a real
proxy in front of simulated backends and a backend that echoes what reached it.

`mtp-demo` (simulated off/max) takes `claude-*` and `gpt-*` names by pattern; `echo` is
tests/support/misbehaving_backend.py, which answers /tokenize and /props with the path it was
called with and, asked to, sends a stream's final event and then never ends it. There is no default
model: an unknown name is a 404.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from proxy.serving.passthrough import COMPUTED, FORWARDED_GET, FORWARDED_POST, REFUSED
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
)
from tests.support.misbehaving_backend import DEEP_EVENT, running_backend

KEY = "sk-unused"
UA = "route-probe/1.0"
PATTERNS = {"claude-*": "mtp-demo", "gpt-*": "mtp-demo"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
ECHO_SLOTS = 4  # llama-server's default -np, taken for a backend at a url
SLOW = {"X-Echo-Delay": "0.2"}  # the echo backend answers after that long


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_backend("ok", "--chunks", "3") as url:
        yield url


def echo_model(url: str) -> dict[str, Any]:
    return {"name": "echo", "backend": "simulator", "profiles": [{"name": "e", "url": url}]}


@pytest.fixture(scope="module")
def proxy(echo_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    demo = simulator_model(
        time_scale=50.0,
        profiles=[{"name": "off"}, {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}],
    )
    config = proxy_config([demo, echo_model(echo_url)])
    config["model_names"] = {"patterns": PATTERNS}
    with running_proxy(config, tmp_path_factory.mktemp("client-routes")) as running:
        yield running


def call(
    proxy: ProxyProcess,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        sent = {"User-Agent": UA, "Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=sent)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def request_lines(proxy: ProxyProcess, keep: Callable[[dict[str, Any]], bool]) -> list[Any]:
    """The proxy's request lines that `keep` selects, once written (bookkeeping is deferred)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [x for x in proxy.log_lines() if x.get("event") == "request" and keep(x)]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


# --- token counting and llama-server's other read-only routes ----------------------------------


def test_anthropic_sdk_counts_tokens_of_a_claude_model(proxy: ProxyProcess) -> None:
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    short = client.messages.count_tokens(
        model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}]
    )
    long = client.messages.count_tokens(
        model="claude-haiku-4-5",
        system="You are a coding agent.",
        messages=[{"role": "user", "content": "hi " * 200}],
    )
    assert 0 < short.input_tokens < long.input_tokens


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses/input_tokens", {"model": "gpt-5", "input": "hello there"}),
        ("/responses/input_tokens", {"model": "gpt-5", "input": "hello there"}),
        (
            "/v1/chat/completions/input_tokens",
            {"model": "mtp-demo", "messages": [{"role": "user", "content": "hello there"}]},
        ),
    ],
)
def test_openai_input_tokens_routes(proxy: ProxyProcess, path: str, body: Any) -> None:
    status, headers, raw = call(proxy, "POST", path, body)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["object"] == "response.input_tokens" and answer["input_tokens"] > 0
    assert headers["X-MTP-Backend"].startswith("mtp-demo/")


def test_tokenize_detokenize_and_props_reach_a_backend(proxy: ProxyProcess) -> None:
    text = "hello world, tokenized"
    status, _, raw = call(proxy, "POST", "/tokenize", {"model": "mtp-demo", "content": text})
    assert status == 200, raw
    tokens = json.loads(raw)["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    status, _, raw = call(proxy, "POST", "/detokenize", {"model": "mtp-demo", "tokens": tokens})
    assert (status, json.loads(raw)["content"]) == (200, text)
    status, headers, raw = call(proxy, "GET", "/props?model=mtp-demo")
    assert status == 200 and json.loads(raw)["default_generation_settings"]["n_ctx"] > 0
    assert headers["X-MTP-Backend"].startswith("mtp-demo/")


def test_method_path_and_query_reach_the_backend_unchanged(proxy: ProxyProcess) -> None:
    status, _, raw = call(proxy, "POST", "/tokenize?with_pieces=1&x=%2F", {"model": "echo"})
    assert (status, json.loads(raw)) == (
        200,
        {"method": "POST", "path_qs": "/tokenize?with_pieces=1&x=%2F"},
    )
    status, _, raw = call(proxy, "GET", "/props?model=echo&a=b")
    assert (status, json.loads(raw)) == (200, {"method": "GET", "path_qs": "/props?model=echo&a=b"})


def concrete(path: str) -> str:
    """A route's path with each {parameter} filled in."""
    return re.sub(r"\{[^}]*\}", "0", path)


REFUSED_CALLS = [
    (method, concrete(path) + query)
    for pattern, path in REFUSED
    for method in (METHODS if pattern == "*" else (pattern,))
    for query in (
        ("", "?action=save", "?action=restore", "?action=erase") if "{" in path else ("",)
    )
]


def test_every_route_that_changes_a_backend_is_refused_and_never_reaches_one(
    proxy: ProxyProcess, echo_url: str
) -> None:
    """Each refused route of the API reference, every method where any is refused, answered
    403 and never seen by the backend the body names (it records every request it gets)."""
    before = len(recorded(echo_url)["requests"])
    for method, path in REFUSED_CALLS:
        status, _, raw = call(proxy, method, path, {"model": "echo"})
        assert status == 403, (method, path, raw)
        if method != "HEAD":
            error = json.loads(raw)["error"]
            assert error["type"] == "permission_error" and "backend's state" in error["message"]
    reached = recorded(echo_url)["requests"][before:]
    assert reached == [], reached


def test_every_forwarded_route_reaches_a_backend_unchanged(
    proxy: ProxyProcess, echo_url: str
) -> None:
    for path in FORWARDED_POST:
        before = len(recorded(echo_url)["requests"])
        status, headers, raw = call(proxy, "POST", f"{path}?q=1", {"model": "echo"})
        assert status == 200 and headers["X-MTP-Backend"] == "echo/e", (path, status, raw)
        assert recorded(echo_url)["requests"][before:] == [["POST", f"{path}?q=1"]], path
        if path != "/apply-template":  # the backend answers that one as the template check's
            assert json.loads(raw) == {"method": "POST", "path_qs": f"{path}?q=1"}
    for path in FORWARDED_GET:
        status, _, raw = call(proxy, "GET", f"{path}?model=echo")
        assert (status, json.loads(raw)) == (
            200,
            {"method": "GET", "path_qs": f"{path}?model=echo"},
        )


def test_routes_that_compute_on_a_slot_wait_for_one(proxy: ProxyProcess, echo_url: str) -> None:
    """Embeddings and reranking run on llama-server's slots: never more at once than the
    backend has (4 here), the rest wait in the model's queue and are answered in turn."""
    for path in sorted(COMPUTED):
        with ThreadPoolExecutor(12) as pool:
            answers = list(
                pool.map(
                    lambda _, p=path: call(proxy, "POST", p, {"model": "echo"}, SLOW)[0],
                    range(12),
                )
            )
        assert answers == [200] * 12, (path, answers)
        assert recorded(echo_url)["most_at_once"][path] == ECHO_SLOTS, path


def recorded(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/recorded", timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_forwarded_and_refused_routes_are_counted_like_generations(proxy: ProxyProcess) -> None:
    tokenized = requests_counted(proxy, "mtp-demo", "/tokenize", "200")
    refused = requests_counted(proxy, "none", "/slots/{id_slot}", "403")
    assert call(proxy, "POST", "/tokenize", {"model": "mtp-demo", "content": "hi"})[0] == 200
    assert call(proxy, "POST", "/slots/0?action=erase", {"model": "mtp-demo"})[0] == 403
    assert requests_counted(proxy, "mtp-demo", "/tokenize", "200") == tokenized + 1
    assert requests_counted(proxy, "none", "/slots/{id_slot}", "403") == refused + 1


# --- model names ----------------------------------------------------------------------------


def test_agent_model_names_reach_the_local_model_by_pattern(proxy: ProxyProcess) -> None:
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    answer = claude.messages.create(
        model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.content and answer.usage.output_tokens > 0
    gpt = openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0)
    chat = gpt.chat.completions.create(
        model="gpt-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].message.content


def test_an_unknown_name_without_a_default_is_404_in_each_api_shape(proxy: ProxyProcess) -> None:
    body = {
        "model": "llama-unknown",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    status, _, raw = call(proxy, "POST", "/v1/messages", body)
    assert status == 404 and json.loads(raw)["type"] == "error"
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    for path in ("/v1/chat/completions", "/chat/completions", "/tokenize"):
        status, _, raw = call(proxy, "POST", path, body)
        assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found", path
    status, _, raw = call(proxy, "POST", "/v1/messages/count_tokens", body)
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"


def test_a_deeply_nested_model_name_is_a_404_not_a_500(proxy: ProxyProcess) -> None:
    """Valid JSON (under the parser's depth limit) whose repr exceeds Python's recursion limit:
    the refusal used to build its message with str() and answered 500."""
    deep = b'{"model":' + b"[" * 1000 + b"]" * 1000 + b', "messages": []}'
    for path in ("/v1/chat/completions", "/tokenize"):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        try:
            conn.request("POST", path, body=deep, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            status, raw = response.status, response.read()
        finally:
            conn.close()
        error = json.loads(raw)["error"]
        assert status == 404 and error["code"] == "model_not_found", (path, raw[:200])
        assert error["message"] == "model of type list does not exist"


# --- unprefixed generation routes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
            "chat",
        ),
        ("/completions", {"prompt": "hi", "max_tokens": 8}, "completions"),
        ("/responses", {"input": "hi", "max_output_tokens": 8}, "responses"),
    ],
)
def test_unprefixed_generation_routes_are_routed(
    proxy: ProxyProcess, path: str, body: dict[str, Any], api: str
) -> None:
    request_id = f"{abs(hash(path)):x}"
    status, headers, raw = call(
        proxy, "POST", path, {"model": "mtp-demo", **body}, {"X-Request-Id": request_id}
    )
    assert status == 200, raw
    assert headers["X-MTP-Profile"] in {"off", "max"} and headers["X-MTP-Route-Reason"]
    (line,) = request_lines(proxy, lambda x: x["request_id"] == request_id)
    assert (line["api"], line["path"], line["status"]) == (api, path, 200)
    assert line["request_class"] and line["output_tokens"]


# --- the request log ------------------------------------------------------------------------


def test_every_request_gets_a_line_with_method_path_agent_and_status(proxy: ProxyProcess) -> None:
    # /health and /metrics, the polled paths, are debug lines (tests/proxy/test_logs.py).
    cases = [
        ("GET", "/nope?probe=404", 404),
        ("GET", "/v1/chat/completions?probe=405", 405),
        ("HEAD", "/v1/models?probe=head", 200),
        ("GET", "/v1/models?probe=models", 200),
        ("POST", "/tokenize?probe=fwd", 200),
    ]
    for method, path, expected in cases:
        status, _, _ = call(proxy, method, path, {"model": "mtp-demo", "content": "x"})
        assert status == expected, path
    for method, path, expected in cases:
        (line,) = request_lines(proxy, lambda x, p=path: x["path"] == p)
        assert (line["method"], line["status"], line["user_agent"]) == (method, expected, UA)
        assert isinstance(line["duration_s"], float)
    (forwarded,) = request_lines(proxy, lambda x: x["path"] == "/tokenize?probe=fwd")
    assert forwarded["model"] == "mtp-demo" and forwarded["backend"].startswith("mtp-demo/")


# --- a complete answer is complete, even if the client leaves right after it --------------------


FINAL = {
    "chat": ("/v1/chat/completions", b"data: [DONE]"),
    "messages": ("/v1/messages", b"message_stop"),
    "responses": ("/v1/responses", b"response.completed"),
}


def read_until_final_then_close(proxy: ProxyProcess, api: str, request_id: str) -> None:
    """A client that reads the stream up to its final event and closes at once, as Codex does
    after response.completed; the backend never ends the stream."""
    path, marker = FINAL[api]
    body = json.dumps(
        {"model": "echo", "stream": True, "max_tokens": 8, "messages": [], "input": "x"}
    )
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Misbehave: hang-after-final:3\r\nX-Request-Id: {request_id}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head.encode())
        seen = b""
        while marker not in seen:
            chunk = sock.recv(65536)
            assert chunk, f"the stream ended before its final event: {seen[-300:]!r}"
            seen += chunk


@pytest.mark.parametrize("api", sorted(FINAL))
def test_a_client_that_closes_after_the_final_event_got_a_complete_answer(
    proxy: ProxyProcess, api: str
) -> None:
    request_id = f"f1a1{sorted(FINAL).index(api)}"
    before = requests_counted(proxy, "echo", api, "200")
    learned_before = learned_samples(proxy, "echo")
    read_until_final_then_close(proxy, api, request_id)
    (line,) = request_lines(proxy, lambda x: x["request_id"] == request_id)
    assert line["status"] == 200 and line["error"] is None, line
    assert requests_counted(proxy, "echo", api, "200") == before + 1
    if api == "responses":  # the only one of the three whose echo reports usage: learned from
        assert line["output_tokens"] == 8, line
        assert learned_samples(proxy, "echo") == learned_before + 1


def learned_samples(proxy: ProxyProcess, model: str) -> int:
    status, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    return sum(int(row["samples"]) for row in routing["learned"] if row["model"] == model)


def requests_counted(proxy: ProxyProcess, model: str, api: str, status: str) -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for row in text.splitlines():
        labels = (f'model="{model}"', f'api="{api}"', f'status="{status}"')
        if row.startswith("mtp_proxy_requests_total{") and all(x in row for x in labels):
            total += float(row.rsplit(" ", 1)[1])
    return total


# --- Responses stream events completed for strict clients ---------------------------------------


def test_openai_responses_stream_helper_works(proxy: ProxyProcess) -> None:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0)
    deltas: list[str] = []
    with client.responses.stream(
        model="gpt-5", input="hello there", max_output_tokens=24
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert deltas and final.output_text == "".join(deltas)


def test_responses_events_carry_indices_and_a_sequence(proxy: ProxyProcess) -> None:
    body = {"model": "mtp-demo", "input": "hello there", "stream": True, "max_output_tokens": 16}
    status, _, raw = call(proxy, "POST", "/v1/responses", body)
    assert status == 200
    events = [json.loads(x[6:]) for x in raw.decode().split("\n") if x.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all((e["output_index"], e["content_index"]) == (0, 0) for e in deltas)
    created = events[0]["response"]
    assert created["model"] == "mtp-demo" and created["output"] == [] and created["created_at"]


def test_a_responses_event_that_cannot_be_completed_passes_and_the_stream_goes_on(
    proxy: ProxyProcess,
) -> None:
    """An event nested deeper than the indexer writes raised mid-stream: the error answer that
    followed was a second HTTP head inside the stream's body. Now it passes unchanged, the
    events after it are indexed, the stream ends normally, under its one head."""
    body = json.dumps({"model": "echo", "stream": True, "input": "x"}).encode()
    head = (
        f"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Misbehave: deep-event:2\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.sendall(head + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.count(b"HTTP/1.1 ") == 1, raw[-500:]
    assert DEEP_EVENT in raw
    tail = raw.split(DEEP_EVENT)[1]
    assert b"event: response.completed" in tail and b'"sequence_number":' in tail


def test_v1_health_is_health(proxy: ProxyProcess) -> None:
    """llama-server's alias: the same answer as /health (200 once every model has a ready
    backend, with the count per model)."""
    health, v1 = proxy.get_json("/health"), proxy.get_json("/v1/health")
    assert v1 == health and v1[0] == 200 and v1[1]["ready_backends"]["echo"] == 1


def test_responses_streams_pass_unchanged_with_the_indices_off(
    echo_url: str, tmp_path: Path
) -> None:
    """[compat] responses_stream_indices = false: the Responses stream's bytes are relayed as
    the backend sent them, like every other API's."""
    body = {"model": "echo", "stream": True, "input": "x"}
    config = proxy_config([echo_model(echo_url)])
    config["compat"] = {"responses_stream_indices": False}
    with running_proxy(config, tmp_path) as plain:
        through = stream_bytes(plain.url + "/v1/responses", body)
    direct = stream_bytes(echo_url + "/v1/responses", body)
    assert through == direct and b"sequence_number" not in through


def test_a_backend_error_on_count_tokens_comes_back_in_anthropic_shape(proxy: ProxyProcess) -> None:
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(model="claude-haiku-4-5", messages=[])
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


@pytest.mark.parametrize("api", sorted(FINAL))
def test_streams_of_other_apis_pass_byte_for_byte(
    proxy: ProxyProcess, echo_url: str, api: str
) -> None:
    path, _ = FINAL[api]
    body = {"model": "echo", "stream": True, "max_tokens": 8, "messages": [], "input": "x"}
    direct = stream_bytes(echo_url + path, body)
    through = stream_bytes(proxy.url + path, body)
    if api != "responses":
        assert through == direct
    else:  # the one the proxy completes: the same events, with a sequence
        assert through != direct and b'"sequence_number":0' in through
        assert through.count(b"\n\n") == direct.count(b"\n\n")


def stream_bytes(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return bytes(response.read())

"""The mends through a real proxy (proxy/compat), on what real agents sent (tests/fixtures/compat).

Backends: `qwen`, the simulator as a Qwen3.6 box (setup-b: its template refuses a late system
message with llama-server's 500); `chatml`, the simulator whose template takes one in place
(fast); `tiny`, fast with a 256-token context (overflows); `echo`, a remote backend that answers
with the body it received (tests/support/misbehaving_backend.py, echo-body), and `tools`, one
that calls the tool a header names, as llama-server words a Responses function call. A second
proxy has every [compat] switch off: what the mends spare the clients shows there.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.compat.input_items import ITEM_REFERENCE_ADVICE
from proxy.compat.output_format import MESSAGE as OUTPUT_FORMAT_MESSAGE
from proxy.compat.overflow import RESPONSES_MESSAGE
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.misbehaving_backend import running_backend

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"
CLAUDE_TURNS = [f"claude-code-turn{n}.json" for n in range(1, 6)]
OFF = {
    "system_turns": "off",
    "responses_input_items": False,
    "structured_output": False,
    "named_tool_choice": False,
    "codex_additional_tools": False,
    "context_overflow_errors": False,
    "session_prefix": False,
}
REFUSED = "the model's chat template refused these messages: "
LATE_SYSTEM = "System message must be at the beginning."
LATE_CHAT = {
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "The date changed."},
    ],
    "max_tokens": 4,
}


def one_process(name: str, preset: str, *args: str) -> dict[str, Any]:
    model = simulator_model(
        name, preset=preset, time_scale=1000.0, draft_control="per-request", extra_args=list(args)
    )
    model["profiles"] = [
        {"name": "off"},
        {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
    ]
    return model


def remote(name: str, url: str) -> dict[str, Any]:
    return {"name": name, "backend": "simulator", "profiles": [{"name": "off", "url": url}]}


def config(echo_url: str, tools_url: str, compat: dict[str, Any] | None = None) -> dict[str, Any]:
    models = [
        one_process("qwen", "setup-b"),
        one_process("chatml", "fast"),
        one_process("tiny", "fast", "-c", "256"),
        remote("echo", echo_url),
        remote("tools", tools_url),
    ]
    settings = proxy_config(models)
    settings["compat"] = compat or {}
    return settings


READY = {"qwen": 1, "chatml": 1, "tiny": 1, "echo": 1, "tools": 1}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[str, str]]:
    with running_backend("echo-body") as echo, running_backend("call-tool") as tools:
        yield echo, tools


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory, backends: tuple[str, str]
) -> Iterator[ProxyProcess]:
    with running_proxy(config(*backends), tmp_path_factory.mktemp("compat")) as running:
        wait_all_ready(running, READY)
        yield running


@pytest.fixture(scope="module")
def unmended(
    tmp_path_factory: pytest.TempPathFactory, backends: tuple[str, str]
) -> Iterator[ProxyProcess]:
    settings = config(*backends, compat=OFF)
    with running_proxy(settings, tmp_path_factory.mktemp("compat-off")) as running:
        wait_all_ready(running, READY)
        yield running


def fixture(name: str, model: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text("utf-8"))
    return {**body, "model": model, **changes}


def post(
    proxy: ProxyProcess,
    path: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(proxy.url + path, data=data, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def echoed(answer: bytes) -> bytes:
    """The body the echo backend received."""
    content: str = json.loads(answer)["choices"][0]["message"]["content"]
    return content.encode()


def logged(proxy: ProxyProcess, event: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10):
        pass  # a scrape flushes the deferred log lines
    return [line for line in proxy.log_lines() if line.get("event") == event]


# --- the template check, as an operator sees it ---------------------------------------------------


def test_each_backend_shows_what_its_template_does(proxy: ProxyProcess) -> None:
    _, admin = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    found = {b["model"]: b["chat_template"]["late_system"] for b in admin["backends"]}
    assert found == {
        "qwen": "refused",
        "chatml": "in-place",
        "tiny": "in-place",
        "echo": "unknown",  # answers /apply-template without a prompt: not llama-server
        "tools": "unknown",
    }
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    metric = {
        sample.labels["model"]: sample.labels["late_system"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_late_system" and sample.value == 1
    }
    assert metric == found


# --- late system messages -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_claude_code_session_is_served_on_the_refusing_template(
    proxy: ProxyProcess, stream: bool
) -> None:
    for name in CLAUDE_TURNS:
        body = fixture(name, "qwen", stream=stream, max_tokens=8)
        status, answer = post(proxy, "/v1/messages?beta=true", body)
        assert status == 200, (name, answer[:300])


def test_the_refusing_template_refuses_without_the_mend(unmended: ProxyProcess) -> None:
    status, answer = post(unmended, "/v1/messages", fixture(CLAUDE_TURNS[0], "qwen", max_tokens=8))
    # llama-server's 500 is the client's error (proxy/compat/template_refusal): a 400 with the
    # template's words, in the Anthropic shape the proxy gives every error there
    assert status == 400
    assert json.loads(answer)["error"]["message"] == REFUSED + LATE_SYSTEM


def test_the_log_line_names_the_mends(proxy: ProxyProcess) -> None:
    post(proxy, "/v1/chat/completions", {**LATE_CHAT, "model": "qwen"})
    post(proxy, "/v1/chat/completions", {**LATE_CHAT, "model": "chatml"})
    lines = [line for line in logged(proxy, "request") if line.get("api") == "chat"]
    by_model = {line["model"]: line.get("mended") for line in lines if line["status"] == 200}
    assert by_model["qwen"] == ["system_turns"]
    assert by_model["chatml"] is None


@pytest.mark.parametrize(
    ("name", "model", "path"),
    [
        ("codex-default-model.json", "qwen", "/v1/responses"),
        ("codex-named-model.json", "qwen", "/v1/responses"),
        ("opencode-responses-turn2.json", "qwen", "/v1/responses"),
        ("opencode-responses-turn2-reasoning.json", "qwen", "/v1/responses"),
        ("codex-default-model-custom-call.json", "chatml", "/v1/responses"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_agents_requests_are_served(
    proxy: ProxyProcess, unmended: ProxyProcess, name: str, model: str, path: str, stream: bool
) -> None:
    body = fixture(name, model, stream=stream, max_output_tokens=8)
    status, answer = post(proxy, path, body)
    assert status == 200, answer[:300]
    refused, _ = post(unmended, path, body)
    assert refused == 400  # llama-server's "Cannot determine type", or the template's refusal


def test_a_template_that_takes_them_gets_the_clients_bytes(proxy: ProxyProcess) -> None:
    raw = json.dumps({**LATE_CHAT, "model": "echo"}, indent=1).encode()
    status, answer = post(proxy, "/v1/chat/completions", raw)
    assert status == 200 and echoed(answer) == raw


def test_system_turns_on_rewrites_for_every_backend(
    tmp_path: Path, backends: tuple[str, str]
) -> None:
    settings = config(*backends, compat={"system_turns": "on"})
    settings["models"] = [remote("echo", backends[0])]
    with running_proxy(settings, tmp_path) as running:
        status, answer = post(running, "/v1/chat/completions", {**LATE_CHAT, "model": "echo"})
    sent = json.loads(echoed(answer))
    assert status == 200
    assert sent["messages"][1] == {
        "role": "user",
        "content": "<system-reminder>\nThe date changed.\n</system-reminder>",
    }


def test_a_body_that_cannot_be_mended_goes_as_it_came_and_the_log_says_why(
    proxy: ProxyProcess,
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    body = {
        "model": "qwen",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [image]}],
    }
    status, answer = post(proxy, "/v1/chat/completions", body)
    assert status == 400 and json.loads(answer)["error"]["message"] == REFUSED + LATE_SYSTEM
    why = logged(proxy, "request_not_mended")
    assert why and "image_url" in why[-1]["reason"] and why[-1]["backend"] == "qwen/one-process"


def test_token_counting_is_mended_like_generation(
    proxy: ProxyProcess, unmended: ProxyProcess
) -> None:
    body = fixture(CLAUDE_TURNS[3], "qwen")
    status, counted = post(proxy, "/v1/messages/count_tokens", body)
    assert status == 200 and json.loads(counted)["input_tokens"] > 1000
    assert post(unmended, "/v1/messages/count_tokens", body)[0] == 400


# --- Claude Code's billing header -----------------------------------------------------------------


def test_two_sessions_reach_the_backend_with_the_same_first_line(proxy: ProxyProcess) -> None:
    first = []
    for name in ("claude-code-say-hi.json", "claude-code-turn1.json"):
        status, answer = post(proxy, "/v1/messages", fixture(name, "echo", max_tokens=4))
        assert status == 200
        first.append(json.loads(echoed(answer))["system"][0])
    assert first[0] == first[1]
    assert first[0]["text"].startswith("x-anthropic-billing-header: cc_version=2.1.332.fff;")


# --- Responses: structured output, Codex's tools --------------------------------------------------


def test_text_format_reaches_llama_server_as_response_format(proxy: ProxyProcess) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "answer", "schema": schema}
    body = {"model": "echo", "input": "2+2?", "text": {"format": fmt}}
    status, answer = post(proxy, "/v1/responses", body)
    sent = json.loads(echoed(answer))
    assert status == 200
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema},
    }


def test_a_plain_responses_request_keeps_its_bytes(proxy: ProxyProcess) -> None:
    raw = json.dumps(
        {"model": "echo", "input": [{"type": "message", "role": "user", "content": "hi"}]}
    )
    status, answer = post(proxy, "/v1/responses", raw.encode())
    assert status == 200 and echoed(answer) == raw.encode()


@pytest.mark.parametrize("stream", [False, True])
def test_codex_gets_its_custom_tool_call_back(proxy: ProxyProcess, stream: bool) -> None:
    body = fixture("codex-default-model.json", "tools", stream=stream)
    headers = {"X-Call-Tool": "exec", "X-Call-Arguments": json.dumps({"input": "text('hi')"})}
    status, answer = post(proxy, "/v1/responses", body, headers)
    assert status == 200, answer[:300]
    items = output_items(answer, stream)
    assert items == [
        {
            "id": "fc_1",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "exec",
            "input": "text('hi')",
        }
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_codex_gets_the_namespace_of_a_namespaced_call(proxy: ProxyProcess, stream: bool) -> None:
    body = fixture("codex-default-model.json", "tools", stream=stream)
    headers = {"X-Call-Tool": "sleep", "X-Call-Arguments": '{"duration_ms": 5}'}
    status, answer = post(proxy, "/v1/responses", body, headers)
    assert status == 200, answer[:300]
    [item] = output_items(answer, stream)
    assert (item["type"], item["name"], item["namespace"]) == ("function_call", "sleep", "clock")


def test_without_the_mend_codex_tools_never_reach_the_backend(unmended: ProxyProcess) -> None:
    body = fixture("codex-default-model.json", "tools")
    status, answer = post(unmended, "/v1/responses", body, {"X-Call-Tool": "exec"})
    assert status == 400 and b"no function tool 'exec'" in answer


def output_items(answer: bytes, stream: bool) -> list[dict[str, Any]]:
    """The answer's output items: the complete body's, or those of the stream's done events."""
    if not stream:
        items: list[dict[str, Any]] = json.loads(answer)["output"]
        return items
    events = [json.loads(e.split(b"data: ", 1)[1]) for e in answer.split(b"\n\n") if e.strip()]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "response.completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == events[-1]["response"]["output"]
    return done


# --- chat: a named tool_choice --------------------------------------------------------------------


def test_a_named_tool_choice_is_forced_as_required(
    proxy: ProxyProcess, unmended: ProxyProcess
) -> None:
    """llama-server reads a tool_choice object as "auto": the proxy sends "required" with the
    named function the only tool, which llama-server enforces."""
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("read_file", "get_time")
    ]
    named = {"type": "function", "function": {"name": "get_time"}}
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    status, answer = post(proxy, "/v1/chat/completions", {**body, "tool_choice": named})
    assert status == 200
    received = json.loads(echoed(answer))
    assert (received["tool_choice"], received["tools"]) == ("required", tools[1:])
    status, answer = post(unmended, "/v1/chat/completions", {**body, "tool_choice": named})
    assert json.loads(echoed(answer))["tool_choice"] == named  # as sent: llama-server's "auto"
    unknown = {"type": "function", "function": {"name": "nope"}}
    status, answer = post(proxy, "/v1/chat/completions", {**body, "tool_choice": unknown})
    assert status == 400
    assert json.loads(answer)["error"]["message"] == (
        "tool_choice names the function 'nope', which is not among the request's tools"
    )


# --- Responses: item_reference -------------------------------------------------------------------


def test_an_item_reference_is_a_400_that_says_what_to_send(
    proxy: ProxyProcess, unmended: ProxyProcess
) -> None:
    """What @ai-sdk/openai sends for an earlier turn by default: llama-server stores no
    responses, so nothing can resolve it; the answer says what to send instead."""
    body = {
        "model": "chatml",
        "max_output_tokens": 8,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "item_reference", "id": "msg_0123"},
            {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
        ],
    }
    for stream in (False, True):
        status, answer = post(proxy, "/v1/responses", {**body, "stream": stream})
        assert status == 400, answer
        error = json.loads(answer)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("input[1] is an item_reference (id 'msg_0123'): ")
        assert error["message"].endswith(ITEM_REFERENCE_ADVICE)
    status, answer = post(unmended, "/v1/responses", body)  # llama-server's own, bare
    assert (status, json.loads(answer)["error"]["message"]) == (
        400,
        "Cannot determine type of 'item'",
    )


# --- Messages: output_config.format ---------------------------------------------------------------


def test_output_config_format_is_a_400_naming_the_field(
    proxy: ProxyProcess, unmended: ProxyProcess
) -> None:
    body = {
        "model": "chatml",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "2+2?"}],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    }
    status, answer = post(proxy, "/v1/messages", body)
    assert status == 400
    assert json.loads(answer) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": OUTPUT_FORMAT_MESSAGE},
    }
    assert post(unmended, "/v1/messages", body)[0] == 200  # silently ignored by llama-server


# --- context overflow -----------------------------------------------------------------------------

LONG = "hello world " * 400
OVERFLOWS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
    ("/v1/completions", {"prompt": LONG}),
    ("/v1/responses", {"input": LONG}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": LONG}]}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body"), OVERFLOWS)
def test_a_context_overflow_is_each_apis_own_error(
    proxy: ProxyProcess, path: str, body: dict[str, Any], stream: bool
) -> None:
    status, answer = post(proxy, path, {**body, "model": "tiny", "stream": stream})
    assert status == 400
    error = json.loads(answer)
    if path == "/v1/messages":
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"].startswith("prompt is too long: ")
        assert error["error"]["message"].endswith(" tokens > 256 maximum")
        return
    assert error["error"]["code"] == "context_length_exceeded"
    assert error["error"]["type"] == "invalid_request_error"
    if path == "/v1/responses":
        assert (error["error"]["message"], error["error"]["param"]) == (RESPONSES_MESSAGE, "input")
    else:
        assert "maximum context length is 256 tokens" in error["error"]["message"]


def test_without_the_mend_the_overflow_is_llama_servers_own(unmended: ProxyProcess) -> None:
    path, body = OVERFLOWS[0]
    status, answer = post(unmended, path, {**body, "model": "tiny"})
    assert status == 400
    assert json.loads(answer)["error"]["type"] == "exceed_context_size_error"

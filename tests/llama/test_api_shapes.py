"""The simulator accepts what real llama-server accepts, request shape by request shape, on the
real chat templates of the target families, and the proxy gets every agent shape through.

The bodies are the shapes agent CLIs send: Claude Code's Anthropic messages (a `system` turn
after the first user turn, text blocks with cache_control, tool_use / tool_result / thinking /
image blocks, tools with input_schema), Codex's Responses input items (developer messages,
function_call, function_call_output, reasoning), and chat messages with system turns anywhere.
Each goes to the simulator and to a real llama-server on a tiny model; both must answer with the
same status (200, or 400 for what llama-server refuses too), and so must their token counting.

The real server runs with each template: the tiny model's own (plain ChatML, any order goes) and
the sdist's Qwen3.5 (refuses a system message that is not first: 500, which the simulator
models with --refuse-late-system), Gemma 4 and DeepSeek V3.1 (accept it; DeepSeek moves it to
the front). Through `mtp-proxy serve` every shape an agent sends is answered 200 on all four.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bench.processes import ServerProcess, start_simulator
from tests.support.chat_templates import DEEPSEEK_V31, GEMMA4, QWEN35, template_args
from tests.support.harness import ProxyProcess, proxy_config, running_proxy
from tests.support.llama_fixtures import LLAMA, LlamaServer, make_models, running_llama_server

pytestmark = pytest.mark.llama

TOOL = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
FUNCTION = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


MESSAGES: dict[str, dict[str, Any]] = {
    "claude-code-turn": {
        "system": [text("You are Claude Code.", cache_control={"type": "ephemeral"})],
        "tools": [TOOL],
        "messages": [
            {
                "role": "user",
                "content": [text("<system-reminder>ctx</system-reminder>"), text("hi")],
            },
            {"role": "system", "content": "A system turn after the first user turn."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "let me look", "signature": ""},
                    text("Reading it."),
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "read_file",
                        "input": {"path": "a"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [text("print(1)")],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "ok",
                        "is_error": True,
                    },
                    text("go on", cache_control={"type": "ephemeral"}),
                ],
            },
        ],
    },
    "unknown-blocks": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "document", "source": {"type": "text", "data": "x"}},
                    text("what is this?"),
                ],
            }
        ],
    },
    "assistant-without-content": {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}],
    },
}
MESSAGES_REFUSED: dict[str, dict[str, Any]] = {
    "no-role": {"messages": [{"content": "hi"}]},
}
RESPONSES: dict[str, dict[str, Any]] = {
    "codex-turn": {
        "instructions": "You are Codex.",
        "tools": [FUNCTION, {"type": "web_search"}],
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
                "encrypted_content": None,
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Reading it."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "read_file",
                "arguments": '{"path":"a"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "print(1)"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "more"}],
            },
            {"role": "developer", "content": "a developer note in the middle"},
            {"role": "user", "content": "go on"},
        ],
    },
    "string-input": {"input": "hello"},
}
RESPONSES_REFUSED: dict[str, dict[str, Any]] = {
    "reasoning-without-content": {
        "input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": []}]
    },
    "codex-additional-tools-item": {
        "input": [{"type": "additional_tools", "role": "developer", "tools": [FUNCTION]}]
    },
    "input-file": {
        "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]
    },
    "previous-response-id": {"input": "hi", "previous_response_id": "resp_1"},
    "no-input": {"instructions": "x"},
}
CHAT: dict[str, dict[str, Any]] = {
    "system-anywhere": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "late system"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
            {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
        ]
    },
}

CASES: list[tuple[str, str, dict[str, Any], int]] = [
    *(("/v1/messages", name, body, 200) for name, body in MESSAGES.items()),
    *(("/v1/messages", name, body, 400) for name, body in MESSAGES_REFUSED.items()),
    *(("/v1/responses", name, body, 200) for name, body in RESPONSES.items()),
    *(("/v1/responses", name, body, 400) for name, body in RESPONSES_REFUSED.items()),
    *(("/v1/chat/completions", name, body, 200) for name, body in CHAT.items()),
]
COUNTERS = {
    "/v1/messages": "/v1/messages/count_tokens",
    "/v1/responses": "/v1/responses/input_tokens",
    "/v1/chat/completions": "/v1/chat/completions/input_tokens",
}
OWN = "own-chatml"  # the tiny model's own template
TEMPLATES = [OWN, QWEN35, GEMMA4, DEEPSEEK_V31]
# The cases with a system or developer message after the first message (Claude Code's system
# turn, Codex's instructions + developer item, a chat system turn anywhere).
LATE_SYSTEM = {"claude-code-turn", "codex-turn", "system-anywhere"}
LATE_SYSTEM_REFUSAL = "System message must be at the beginning."


def expected_status(template: str, name: str, status: int) -> int:
    """What llama-server answers `name` with `template`: Qwen3.5 refuses a late system turn."""
    return 500 if template == QWEN35 and name in LATE_SYSTEM else status


@pytest.fixture(scope="module", params=TEMPLATES)
def template(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def server_args(template: str) -> list[str]:
    return [] if template == OWN else template_args(template)


@pytest.fixture(scope="module")
def llama(template: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    models = make_models(tmp_path_factory.mktemp("models"))
    args = server_args(template)
    logs = tmp_path_factory.mktemp("logs")
    # 4096 tokens a slot: Qwen3.5's template writes a long preamble before the tools.
    with running_llama_server(models[LLAMA], *args, log_dir=logs, ctx=8192) as server:
        yield server


@pytest.fixture(scope="module")
def simulator(template: str) -> Iterator[ServerProcess]:
    refuse = "--refuse-late-system" if template == QWEN35 else "--no-refuse-late-system"
    server = start_simulator(["--preset", "fast", "-c", "2048", "-np", "2", refuse])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy(llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """`mtp-proxy serve` in front of that llama-server, its mends as configured by default."""
    model = {
        "name": "tiny",
        "backend": "llama-server",
        "draft_control": "per-process",
        "profiles": [{"name": "off", "url": llama.base_url}],
    }
    config = proxy_config([model])
    config["model_names"] = {"default": "tiny"}
    with running_proxy(config, tmp_path_factory.mktemp("proxy")) as running:
        yield running


def post(base_url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("path", "name", "body", "status"),
    [
        pytest.param(path, name, body, status, id=f"{path}:{name}")
        for path, name, body, status in CASES
    ],
)
def test_simulator_and_llama_server_accept_the_same_shapes(
    llama: LlamaServer,
    simulator: ServerProcess,
    template: str,
    path: str,
    name: str,
    body: dict[str, Any],
    status: int,
) -> None:
    expected = expected_status(template, name, status)
    request = {"model": "any", "max_tokens": 4, **body}
    for target in (path, COUNTERS[path]):
        real_status, real = post(llama.base_url, target, request)
        sim_status, sim = post(simulator.url, target, request)
        # The case says what llama-server does; a refusal may be its 500 ("Missing 'role'"),
        # where the simulator says 400.
        assert (real_status == 200) == (expected == 200), (target, real)
        assert sim_status == expected, (target, sim)
        if expected == 500:  # the template's own refusal, word for word
            assert (real_status, real["error"]["message"]) == (500, sim["error"]["message"])
            assert LATE_SYSTEM_REFUSAL in real["error"]["message"]
    if expected == 200:
        assert sim["input_tokens"] > 0 and real["input_tokens"] > 0
        assert ("object" in sim) == ("object" in real) == (path != "/v1/messages")


@pytest.mark.parametrize(
    ("path", "name", "body"),
    [
        pytest.param(path, name, body, id=f"{path}:{name}")
        for path, name, body, s in CASES
        if s == 200
    ],
)
def test_the_proxy_gets_every_agent_shape_through_on_every_template(
    proxy: ProxyProcess, path: str, name: str, body: dict[str, Any]
) -> None:
    request = {"model": "any", "max_tokens": 4, **body}
    for target in (path, COUNTERS[path]):
        status, answer = post(proxy.url, target, request)
        assert status == 200, (target, answer)


def test_tokenize_detokenize_and_apply_template_answer_alike(
    llama: LlamaServer, simulator: ServerProcess, template: str
) -> None:
    for base in (llama.base_url, simulator.url):
        status, tokens = post(base, "/tokenize", {"content": "hello world"})
        assert status == 200 and all(isinstance(t, int) for t in tokens["tokens"])
        status, back = post(base, "/detokenize", {"tokens": tokens["tokens"]})
        assert (status, back["content"]) == (200, "hello world")
        status, applied = post(base, "/apply-template", CHAT["system-anywhere"])
        if template == QWEN35:
            assert status == 500 and LATE_SYSTEM_REFUSAL in applied["error"]["message"]
        else:
            assert status == 200 and "late system" in applied["prompt"]

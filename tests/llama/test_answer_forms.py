"""The simulator answers and refuses `n`, `logprobs`, `response_format` and `tool_choice` as a
real llama-server does, side by side on the same requests: the real patched build on a tiny
model (its own ChatML template, --jinja) and the simulator, both with two slots. Refusals match
word for word (status and error object); answers match in shape (every key, every value's type),
not in text; a json_schema answer validates against its schema on both.

What the real tiny model cannot show (it never calls a tool: a random model with the grammar of
no tool format), the simulator's own test shows: tests/simulator/test_simulator_forms.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from bench.processes import ServerProcess, start_simulator
from tests.support.llama_fixtures import LLAMA, LlamaServer, make_models, running_llama_server

pytestmark = pytest.mark.llama

SLOTS = 2
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


class Reading(BaseModel):
    unit: Literal["c", "f"]
    temp: int
    sunny: bool


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    models = make_models(tmp_path_factory.mktemp("models"))
    logs = tmp_path_factory.mktemp("logs")
    with running_llama_server(
        models[LLAMA], "--jinja", log_dir=logs, parallel=SLOTS, ctx=4096
    ) as server:
        yield server


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    server = start_simulator(["--preset", "fast", "-np", str(SLOTS), "-c", "4096"])
    try:
        yield server
    finally:
        server.stop()


def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    if raw.startswith(b"data: "):
        events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]
        return status, [json.loads(e) for e in events if e != b"[DONE]"]
    return status, json.loads(raw)


def shape(value: Any) -> Any:
    """Every key and the type of every value (a list: its first item's shape)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


REFUSED: dict[str, tuple[str, dict[str, Any]]] = {
    "n 0": (CHAT, {"messages": HELLO, "n": 0}),
    "n past the slots": (CHAT, {"messages": HELLO, "n": SLOTS + 1}),
    "n 0 completion": ("/v1/completions", {"prompt": "hi", "n": 0}),
    "n a string": (CHAT, {"messages": HELLO, "n": "2"}),
    "logprobs a number": (CHAT, {"messages": HELLO, "logprobs": 1, "top_logprobs": 2}),
    "n past the slots responses": ("/v1/responses", {"input": "hi", "n": SLOTS + 1}),
    "top_logprobs alone": (CHAT, {"messages": HELLO, "top_logprobs": 2}),
    "tool_choice unknown": (CHAT, {"messages": HELLO, "tools": TOOLS, "tool_choice": "bogus"}),
    "response_format xml": (CHAT, {"messages": HELLO, "response_format": {"type": "xml"}}),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_llama_servers_words(llama: LlamaServer, sim: ServerProcess, case: str) -> None:
    path, body = REFUSED[case]
    real = post(llama.base_url, path, {**body, "max_tokens": 4})
    simulated = post(sim.url, path, {**body, "max_tokens": 4})
    assert real[0] == 400, real
    assert simulated == real


ANSWERED: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat logprobs": (
        CHAT,
        {"messages": HELLO, "logprobs": True, "top_logprobs": 2},
        lambda a: a["choices"][0]["logprobs"],
    ),
    "completion logprobs": (
        "/v1/completions",
        {"prompt": "hi", "logprobs": 2},
        lambda a: a["choices"][0]["logprobs"],
    ),
    "chat logprobs stream": (
        CHAT,
        {"messages": HELLO, "logprobs": True, "top_logprobs": 2, "stream": True},
        lambda chunks: chunks[1]["choices"][0],
    ),
    "completion logprobs stream": (
        "/v1/completions",
        {"prompt": "hi", "logprobs": 2, "stream": True},
        lambda chunks: chunks[0]["choices"][0],
    ),
    "n choices": (CHAT, {"messages": HELLO, "n": SLOTS}, lambda a: a["choices"]),
    "n completions": ("/v1/completions", {"prompt": "hi", "n": SLOTS}, lambda a: a["choices"]),
    "named tool_choice read as auto": (
        CHAT,
        {
            "messages": HELLO,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        lambda a: a["choices"][0]["message"],
    ),
}


@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_answered_in_llama_servers_shape(llama: LlamaServer, sim: ServerProcess, case: str) -> None:
    path, body, part = ANSWERED[case]
    request = {**body, "max_tokens": 3, "temperature": 0}
    (real_status, real), (sim_status, simulated) = (
        post(llama.base_url, path, request),
        post(sim.url, path, request),
    )
    assert (real_status, sim_status) == (200, 200), (real, simulated)
    assert shape(part(simulated)) == shape(part(real)), (part(simulated), part(real))
    if case.startswith("n "):
        assert [c["index"] for c in part(simulated)] == [c["index"] for c in part(real)]


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_a_structured_answer_validates_on_both(
    llama: LlamaServer, sim: ServerProcess, kind: str
) -> None:
    schema = Reading.model_json_schema()
    response_format: dict[str, Any] = {"type": "json_object", "schema": schema}
    if kind == "json_schema":
        response_format = {"type": kind, "json_schema": {"name": "reading", "schema": schema}}
    body = {"messages": HELLO, "response_format": response_format, "max_tokens": 256}
    for base in (llama.base_url, sim.url):
        status, answer = post(base, CHAT, {**body, "temperature": 0})
        assert status == 200, answer
        Reading.model_validate_json(answer["choices"][0]["message"]["content"])

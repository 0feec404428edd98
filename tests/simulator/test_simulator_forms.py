"""What a request asks of the answer's form, on the simulator as a process over HTTP: `n`,
`logprobs`, `response_format` and `tool_choice`, answered and refused as llama-server (b11434)
answers and refuses them (checked side by side with the real one: tests/llama/
test_answer_forms.py; through the proxy with the official SDK: tests/proxy/test_demo_sdk.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import aiohttp
import pytest
from pydantic import BaseModel

from tests.support.simulator_process import Sim, post, simulator, sse

SLOTS = 2
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 3}},
            "required": ["city", "days"],
        },
    },
}
OTHER_TOOL = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
ENTRY_KEYS = {"id", "token", "bytes", "logprob", "top_logprobs"}


class Day(BaseModel):
    name: Literal["mon", "tue"]
    rain_mm: float


class Forecast(BaseModel):
    city: str
    days: list[Day]
    note: str | None = None


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with simulator("--preset", "fast", "-np", str(SLOTS)) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def chat(http: aiohttp.ClientSession, sim: Sim, **body: Any) -> tuple[int, Any]:
    return await post(http, sim.url + CHAT, {"messages": HELLO, "max_tokens": 64, **body})


async def streamed(
    http: aiohttp.ClientSession, sim: Sim, path: str = CHAT, **body: Any
) -> list[Any]:
    request = {"messages": HELLO, "max_tokens": 64, "stream": True, **body}
    events = await sse(http, sim.url + path, request)
    return [json.loads(data) for _, data in events if data != "[DONE]"]


# --- n --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/v1/responses"])
async def test_n_outside_the_slots_is_llama_servers_400(
    http: aiohttp.ClientSession, sim: Sim, path: str
) -> None:
    for n in (0, SLOTS + 1):
        body = {"messages": HELLO, "prompt": "hi", "input": "hi", "max_tokens": 4, "n": n}
        status, error = await post(http, sim.url + path, body)
        message = f"Field 'n': Value must be between 1 <= value <= {SLOTS}, but got {n}"
        assert (status, error["error"]) == (
            400,
            {"code": 400, "message": message, "type": "invalid_request_error"},
        )


async def test_n_completions_are_as_many_choices(http: aiohttp.ClientSession, sim: Sim) -> None:
    status, answer = await chat(http, sim, n=SLOTS, max_tokens=4)
    assert status == 200
    assert [c["index"] for c in answer["choices"]] == list(range(SLOTS))
    assert all(c["message"]["content"] for c in answer["choices"])
    status, answer = await post(
        http, sim.url + "/v1/completions", {"prompt": "hi", "max_tokens": 4, "n": SLOTS}
    )
    assert status == 200 and len(answer["choices"]) == SLOTS
    status, error = await chat(http, sim, n=SLOTS, stream=True)  # not modelled: said so
    assert status == 400 and "the simulator serves n > 1 only without stream" in str(error)
    status, answer = await post(
        http, sim.url + "/v1/messages", {"messages": HELLO, "max_tokens": 4, "n": 0}
    )
    assert status == 200  # llama-server's Messages converter drops n


# --- logprobs -------------------------------------------------------------------------------------


def check_entries(entries: list[Any], top: int, text: str) -> None:
    assert "".join(e["token"] for e in entries) == text
    for entry in entries:
        assert set(entry) == ENTRY_KEYS
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == top
        assert all(set(t) == ENTRY_KEYS - {"top_logprobs"} for t in entry["top_logprobs"])
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"] < 0


async def test_chat_logprobs_in_llama_servers_shape(http: aiohttp.ClientSession, sim: Sim) -> None:
    status, answer = await chat(http, sim, logprobs=True, top_logprobs=3)
    assert status == 200
    choice = answer["choices"][0]
    assert len(choice["logprobs"]["content"]) == answer["usage"]["completion_tokens"]
    check_entries(choice["logprobs"]["content"], 3, choice["message"]["content"])
    status, answer = await chat(http, sim, logprobs=True, max_tokens=2)
    assert len(answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    chunks = await streamed(http, sim, logprobs=True, top_logprobs=2)
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in tokens)
    text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
    check_entries([c["choices"][0]["logprobs"]["content"][0] for c in tokens], 2, text)
    status, error = await chat(http, sim, top_logprobs=2)
    assert (status, error["error"]["message"]) == (
        400,
        "top_logprobs requires logprobs to be set to true",
    )


async def test_completion_logprobs_in_llama_servers_shape(
    http: aiohttp.ClientSession, sim: Sim
) -> None:
    url = sim.url + "/v1/completions"
    for logprobs, top in ((2, 2), (True, 1)):
        status, answer = await post(
            http, url, {"prompt": "hi", "max_tokens": 8, "logprobs": logprobs}
        )
        assert status == 200
        choice = answer["choices"][0]
        check_entries(choice["logprobs"]["content"], top, choice["text"])
    status, answer = await post(http, url, {"prompt": "hi", "max_tokens": 8, "logprobs": 0})
    assert answer["choices"][0]["logprobs"] is None
    chunks = await streamed(http, sim, path="/v1/completions", prompt="hi", logprobs=1)
    entries = [c["choices"][0]["logprobs"]["content"][0] for c in chunks if c["choices"][0]["text"]]
    check_entries(entries, 1, "".join(c["choices"][0]["text"] for c in chunks))


# --- response_format ------------------------------------------------------------------------------


async def test_a_json_schema_answer_validates(http: aiohttp.ClientSession, sim: Sim) -> None:
    schema = {"name": "forecast", "strict": True, "schema": Forecast.model_json_schema()}
    response_format = {"type": "json_schema", "json_schema": schema}
    status, answer = await chat(http, sim, response_format=response_format, max_tokens=4096)
    assert status == 200 and answer["choices"][0]["finish_reason"] == "stop"
    forecast = Forecast.model_validate_json(answer["choices"][0]["message"]["content"])
    assert forecast.days and forecast.days[0].name in ("mon", "tue")
    chunks = await streamed(http, sim, response_format=response_format, max_tokens=4096)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert Forecast.model_validate_json(text) == forecast
    status, answer = await post(
        http,
        sim.url + "/v1/responses",
        {"input": "weather?", "response_format": response_format, "max_output_tokens": 4096},
    )
    Forecast.model_validate_json(answer["output"][0]["content"][0]["text"])


async def test_json_object_and_an_unknown_type(http: aiohttp.ClientSession, sim: Sim) -> None:
    status, answer = await chat(http, sim, response_format={"type": "json_object"})
    assert status == 200
    assert isinstance(json.loads(answer["choices"][0]["message"]["content"]), dict)
    status, error = await chat(http, sim, response_format={"type": "xml"})
    assert (status, error["error"]["message"]) == (
        400,
        'response_format type must be one of "text" or "json_object", but got: xml',
    )


# --- tool_choice ----------------------------------------------------------------------------------


async def test_tool_choice_required_is_a_call(http: aiohttp.ClientSession, sim: Sim) -> None:
    status, answer = await chat(
        http, sim, tools=[WEATHER_TOOL, OTHER_TOOL], tool_choice="required", max_tokens=512
    )
    assert status == 200
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert (call["type"], call["function"]["name"], len(call["id"])) == (
        "function",
        "get_weather",
        32,
    )
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments["city"], str) and arguments["days"] >= 3
    assert choice["message"]["content"] == ""
    chunks = await streamed(http, sim, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=512)
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["type"] == "function"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == arguments
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_other_tool_choices_as_llama_server_reads_them(
    http: aiohttp.ClientSession, sim: Sim
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("auto", "none", named):  # an object is read as "auto" by llama-server
        status, answer = await chat(http, sim, tools=[WEATHER_TOOL], tool_choice=choice)
        assert status == 200 and "tool_calls" not in answer["choices"][0]["message"]
    status, error = await chat(http, sim, tools=[WEATHER_TOOL], tool_choice="bogus")
    assert (status, error["error"]["message"]) == (400, "Invalid tool_choice: bogus")

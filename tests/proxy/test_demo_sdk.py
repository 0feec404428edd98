"""The demo (the embedded default configuration: `scripts/serve.sh`, one simulated llama-server
behind the proxy) through the official openai SDK: structured output with a pydantic model,
forced tool calls (required, and a named function, which the proxy makes llama-server force),
logprobs, several completions, and llama-server's refusal of `n` in each API's own shape."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy, wait_all_ready

DEMO = Path(__file__).resolve().parents[2] / "proxy" / "config" / "default.toml"
ASK = [{"role": "user", "content": "What is the weather in Paris this week?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


class Day(BaseModel):
    weekday: Literal["mon", "tue", "wed"]
    high_c: float
    rain: bool


class Forecast(BaseModel):
    city: str
    days: list[Day]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    config: dict[str, Any] = tomllib.loads(DEMO.read_text())
    config["server"] |= {"port": 0, "admin_key": ADMIN_KEY}  # as serve.sh's, on a free port
    with running_proxy(config, tmp_path_factory.mktemp("demo")) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1}, timeout=120)  # after its calibration
        yield proxy


@pytest.fixture
def client(demo: ProxyProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=demo.url + "/v1", api_key="none", max_retries=0) as sdk:
        yield sdk


def test_structured_output_parses_into_the_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="mtp-demo", messages=ASK, response_format=Forecast, max_tokens=2048
    )  # type: ignore[call-overload]
    forecast = completion.choices[0].message.parsed
    assert isinstance(forecast, Forecast) and forecast.days, completion


def test_a_required_tool_call(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="mtp-demo", messages=ASK, tools=[WEATHER, TIME], tool_choice="required"
    )  # type: ignore[call-overload]
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["city"], str)  # type: ignore[union-attr]


def test_a_named_tool_call(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    completion = client.chat.completions.create(
        model="mtp-demo", messages=ASK, tools=[WEATHER, TIME], tool_choice=named
    )  # type: ignore[call-overload]
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="'nope', which is not among"):
        client.chat.completions.create(
            model="mtp-demo",
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )  # type: ignore[call-overload]


def test_logprobs_and_several_completions(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="mtp-demo", messages=ASK, max_tokens=8, logprobs=True, top_logprobs=3, n=2
    )  # type: ignore[call-overload]
    assert [c.index for c in completion.choices] == [0, 1]
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    tokens = "".join(t.token for t in logprobs.content)
    assert tokens == completion.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.logprob < 0 for t in logprobs.content)


def test_n_past_the_slots_is_refused_in_each_apis_shape(
    client: openai.OpenAI, demo: ProxyProcess
) -> None:
    words = "Field 'n': Value must be between 1 <= value <= 4, but got 5"
    with pytest.raises(openai.BadRequestError, match=words) as chat:
        client.chat.completions.create(model="mtp-demo", messages=ASK, n=5)  # type: ignore[call-overload]
    assert chat.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match=words):
        client.completions.create(model="mtp-demo", prompt="hi", n=5)
    with pytest.raises(openai.BadRequestError, match=words):
        client.responses.create(model="mtp-demo", input="hi", extra_body={"n": 5})
    with anthropic.Anthropic(base_url=demo.url, api_key="none", max_retries=0) as claude:
        message = claude.messages.create(
            model="mtp-demo", messages=ASK, max_tokens=4, extra_body={"n": 5}
        )  # type: ignore[arg-type]
    assert message.content  # llama-server's Messages converter drops n: an answer

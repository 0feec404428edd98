"""The simulator refuses what llama-server with the Qwen3.5/3.6 template refuses
(simulator/template.py): a late system message, no user query, no messages. On in the presets
that model a Qwen3.6, off in fast, and a flag either way. The 500's body is the pinned
llama-server's, byte for byte in its message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from simulator.template import LATE_SYSTEM_ERROR
from tests.support import template_refusals
from tests.support.simulator_process import Sim, post, simulator

USER = {"role": "user", "content": "hi"}
LATE = {"role": "system", "content": "a system turn after the user's"}
# Each route and a body whose template messages end up [user, system] (or [system, user, system]).
REFUSED = [
    ("/v1/chat/completions", {"messages": [USER, LATE], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [USER, {**LATE, "role": "developer"}], "max_tokens": 4}),
    ("/v1/messages", {"system": "S", "messages": [USER, LATE], "max_tokens": 4}),
    (
        "/v1/responses",
        {"instructions": "S", "input": [{"role": "developer", "content": "D"}, USER]},
    ),
    ("/v1/responses", {"input": [{"role": "developer", "content": "D"}] * 2 + [USER]}),
    ("/apply-template", {"messages": [USER, LATE]}),
    ("/v1/messages/count_tokens", {"messages": [USER, LATE]}),
    ("/v1/chat/completions/input_tokens", {"messages": [USER, LATE]}),
    ("/v1/responses/input_tokens", {"input": [USER, LATE]}),
]
TAKEN = [
    ("/v1/chat/completions", {"messages": [LATE, USER], "max_tokens": 4}),
    ("/v1/messages", {"system": "S", "messages": [USER], "max_tokens": 4}),
    ("/v1/responses", {"instructions": "S", "input": [USER], "max_output_tokens": 4}),
    ("/v1/responses", {"input": [{"role": "developer", "content": "D"}, USER]}),
    ("/v1/completions", {"prompt": "system: late", "max_tokens": 4}),
]


@pytest.fixture(scope="module")
def qwen() -> Iterator[Sim]:
    with simulator("--preset", "setup-b", "--time-scale", "1000") as sim:
        yield sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.parametrize(("path", "body"), REFUSED)
async def test_a_qwen_preset_answers_a_late_system_message_500(
    http: aiohttp.ClientSession, qwen: Sim, path: str, body: dict[str, Any]
) -> None:
    status, answer = await post(http, qwen.url + path, body)
    assert status == 500
    assert answer == {"error": {"code": 500, "message": LATE_SYSTEM_ERROR, "type": "server_error"}}


@pytest.mark.parametrize(("path", "body"), TAKEN)
async def test_a_qwen_preset_takes_a_leading_system_message(
    http: aiohttp.ClientSession, qwen: Sim, path: str, body: dict[str, Any]
) -> None:
    status, answer = await post(http, qwen.url + path, body)
    assert status == 200, answer


@pytest.mark.parametrize(("path", "body", "words"), template_refusals.REFUSED)
async def test_a_qwen_preset_refuses_what_the_template_refuses(
    http: aiohttp.ClientSession, qwen: Sim, path: str, body: dict[str, Any], words: str
) -> None:
    status, answer = await post(http, qwen.url + path, body)
    assert status == 500, answer
    assert answer["error"]["message"].endswith(f"Error: Jinja Exception: {words}")


@pytest.mark.parametrize(("path", "body"), template_refusals.TAKEN)
async def test_a_qwen_preset_takes_what_the_template_takes(
    http: aiohttp.ClientSession, qwen: Sim, path: str, body: dict[str, Any]
) -> None:
    status, answer = await post(http, qwen.url + path, body)
    assert status == 200, answer


async def test_a_stream_is_refused_before_its_first_byte(
    http: aiohttp.ClientSession, qwen: Sim
) -> None:
    body = {"messages": [USER, LATE], "max_tokens": 4, "stream": True}
    async with http.post(qwen.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 500
        assert response.content_type == "application/json"


async def test_a_bad_body_is_still_a_400_first(http: aiohttp.ClientSession, qwen: Sim) -> None:
    body = {"input": [{"role": "assistant", "content": "x"}, LATE]}  # no type: llama-server's 400
    status, answer = await post(http, qwen.url + "/v1/responses", body)
    assert status == 400 and answer["error"]["message"] == "Cannot determine type of 'item'"


@pytest.mark.parametrize(
    ("args", "refuses"),
    [
        (("--preset", "fast"), False),
        (("--preset", "setup-a"), True),
        (("--preset", "setup-b-batched"), True),
        (("--preset", "fast", "--refuse-late-system"), True),
        (("--preset", "setup-b", "--no-refuse-late-system"), False),
    ],
)
async def test_presets_and_the_flag_decide(
    http: aiohttp.ClientSession, args: tuple[str, ...], refuses: bool
) -> None:
    with simulator(*args) as sim:
        status, answer = await post(http, sim.url + "/apply-template", {"messages": [USER, LATE]})
    assert status == (500 if refuses else 200), answer

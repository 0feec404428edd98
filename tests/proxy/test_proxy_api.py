"""The proxy through the official SDKs and raw HTTP, against real simulator backends."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    simulator_model,
    start_proxy,
)

CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say hello in one short sentence."}
]


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


async def test_openai_sdk_chat_non_stream(demo_proxy: ProxyProcess) -> None:
    client = openai.AsyncOpenAI(base_url=demo_proxy.url + "/v1", api_key="unused")
    raw = await client.chat.completions.with_raw_response.create(
        model="mtp-demo", messages=CHAT, max_tokens=16
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0
    assert raw.headers["X-MTP-Profile"] in {"off", "min", "max"}
    assert raw.headers["X-MTP-Route-Reason"]
    await client.close()


async def test_openai_sdk_chat_stream(demo_proxy: ProxyProcess) -> None:
    client = openai.AsyncOpenAI(base_url=demo_proxy.url + "/v1", api_key="unused")
    stream = await client.chat.completions.create(
        model="mtp-demo", messages=CHAT, max_tokens=16, stream=True
    )
    pieces = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p for p in pieces if p)
    await client.close()


async def test_openai_sdk_lists_models_and_aliases(demo_proxy: ProxyProcess) -> None:
    client = openai.AsyncOpenAI(base_url=demo_proxy.url + "/v1", api_key="unused")
    models = [m.id async for m in client.models.list()]
    assert models == ["mtp-demo"]
    await client.close()


async def test_anthropic_sdk_stream(demo_proxy: ProxyProcess) -> None:
    client = anthropic.AsyncAnthropic(base_url=demo_proxy.url, api_key="unused")
    async with client.messages.stream(
        model="mtp-demo", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text
    assert final.usage.output_tokens > 0
    await client.close()


async def test_final_sse_chunk_carries_timings(demo_proxy: ProxyProcess) -> None:
    body = {"model": "mtp-demo", "messages": CHAT, "max_tokens": 8, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(demo_proxy.url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        raw = await response.read()
    events = sse_events(raw)
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert "timings" in events[-1]
    assert events[-1]["choices"][0]["finish_reason"] in {"length", "stop"}
    assert all("timings" not in e for e in events[:-1])
    assert events[-1]["timings"]["predicted_n"] > 0


async def backend_slots(session: aiohttp.ClientSession, proxy: ProxyProcess, name: str) -> Any:
    backends = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    port = next(b["port"] for b in backends if b["name"] == name)
    async with session.get(f"http://127.0.0.1:{port}/slots") as response:
        return await response.json()


async def test_client_disconnect_frees_the_backend_slot(demo_proxy: ProxyProcess) -> None:
    body = {
        "model": "mtp-demo",
        "messages": CHAT,
        "max_tokens": 4000,
        "stream": True,
    }
    headers = {"X-MTP-Profile": "off"}
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            demo_proxy.url + "/v1/chat/completions", json=body, headers=headers
        )
        assert response.headers["X-MTP-Profile"] == "off"
        await response.content.readany()
        slots = await backend_slots(session, demo_proxy, "mtp-demo/off")
        assert any(s["is_processing"] for s in slots)
        response.close()  # the client goes away mid-stream
        disconnected = time.monotonic()
        while time.monotonic() - disconnected < 1.0:
            slots = await backend_slots(session, demo_proxy, "mtp-demo/off")
            if not any(s["is_processing"] for s in slots):
                break
            await asyncio.sleep(0.05)
        assert not any(s["is_processing"] for s in slots), "slot still busy 1 s after disconnect"


@pytest.mark.parametrize(
    ("path", "payload", "status", "dialect"),
    [
        ("/v1/chat/completions", b'{"model": "mtp-demo", "messages": [', 400, "openai"),
        ("/v1/messages", b'{"model": "mtp-demo", "messages": [', 400, "anthropic"),
        ("/v1/chat/completions", b"[1, 2, 3]", 400, "openai"),
        ("/v1/completions", b"\xff\xfe not utf-8", 400, "openai"),
        ("/v1/chat/completions", b'{"model": "nope", "messages": []}', 404, "openai"),
        ("/v1/messages", b'{"model": "nope", "messages": []}', 404, "anthropic"),
        ("/v1/responses", b'{"model": 7, "input": "hi"}', 404, "openai"),
    ],
)
async def test_bad_requests_answer_in_the_api_shape(
    demo_proxy: ProxyProcess, path: str, payload: bytes, status: int, dialect: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            demo_proxy.url + path, data=payload, headers={"Content-Type": "application/json"}
        ) as response,
    ):
        assert response.status == status
        error = await response.json()
    assert_error_shape(error, dialect)


def assert_error_shape(error: dict[str, Any], dialect: str) -> None:
    if dialect == "anthropic":
        assert error["type"] == "error"
        assert error["error"]["type"] and error["error"]["message"]
    else:
        assert error["error"]["message"] and error["error"]["type"]


async def test_oversized_body_is_413(demo_proxy: ProxyProcess) -> None:
    big = b'{"model": "mtp-demo", "prompt": "' + b"x" * (33 * 1024 * 1024) + b'"}'
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(demo_proxy.url + "/v1/completions", data=big) as response:
                assert response.status == 413
                assert_error_shape(await response.json(), "openai")
        except aiohttp.ClientOSError:
            pytest.fail("the proxy reset the connection instead of answering 413")


async def test_unknown_path_and_method_are_json_errors(demo_proxy: ProxyProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(demo_proxy.url + "/v1/nothing-here") as response:
            assert response.status == 404
            assert_error_shape(await response.json(), "openai")
        async with session.get(demo_proxy.url + "/v1/chat/completions") as response:
            assert response.status == 405
            assert_error_shape(await response.json(), "openai")


def test_health_and_metrics(demo_proxy: ProxyProcess) -> None:
    status, health = demo_proxy.get_json("/health")
    assert status == 200
    assert health["ready_backends"] == {"mtp-demo": 3}


async def test_no_ready_backend_is_503_with_retry_after(tmp_path: Path) -> None:
    loading = simulator_model(extra_args=["--load-time", "600"])
    proxy = start_proxy(proxy_config([loading]), tmp_path, wait=False)
    try:
        status, health = proxy.get_json("/health")
        assert status == 503
        assert health["ready_backends"] == {"mtp-demo": 0}
        async with aiohttp.ClientSession() as session:
            for path, dialect in (
                ("/v1/chat/completions", "openai"),
                ("/v1/messages", "anthropic"),
            ):
                body = {"model": "mtp-demo", "messages": CHAT, "max_tokens": 4}
                async with session.post(proxy.url + path, json=body) as response:
                    assert response.status == 503
                    assert int(response.headers["Retry-After"]) >= 1
                    assert_error_shape(await response.json(), dialect)
    finally:
        assert proxy.stop() == 0

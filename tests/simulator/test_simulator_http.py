"""The simulator as a real process on a loopback port, talked to over HTTP with aiohttp."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from simulator import model
from simulator.model import DraftSettings
from simulator.presets import load_preset
from tests.support.simulator_process import MAX3, Sim, metric_values, post, simulator, sse


@pytest.fixture(scope="module")
def spec_sim() -> Iterator[Sim]:
    with simulator("--preset", "fast", "--metrics", "-np", "2", *MAX3, "-ngl", "99") as sim:
        yield sim


@pytest.fixture(scope="module")
def off_sim() -> Iterator[Sim]:
    with simulator("--preset", "fast", "-np", "1", "--alias", "demo-off") as sim:
        yield sim


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


CHAT = {"messages": [{"role": "user", "content": "Hi there! How are you today?"}]}


TIMING_KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}


# --- chat completions ----------------------------------------------------------------------------


async def test_chat_non_stream_with_and_without_drafting(
    http: aiohttp.ClientSession, spec_sim: Sim, off_sim: Sim
) -> None:
    status, body = await post(
        http, spec_sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": 40}
    )
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 40
    t = body["timings"]
    assert set(t) == TIMING_KEYS | {"draft_n", "draft_n_accepted"}
    assert t["predicted_n"] == 40 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert t["cache_n"] + t["prompt_n"] == body["usage"]["prompt_tokens"]

    status, body = await post(http, off_sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": 8})
    assert status == 200
    assert set(body["timings"]) == TIMING_KEYS  # draft fields absent when nothing was drafted
    assert body["model"] == "demo-off"


async def test_natural_stop_and_max_completion_tokens(
    http: aiohttp.ClientSession, off_sim: Sim
) -> None:
    _, body = await post(http, off_sim.url + "/v1/chat/completions", CHAT)
    assert body["choices"][0]["finish_reason"] == "stop"
    preset = load_preset("fast").output
    assert preset.prose_min <= body["usage"]["completion_tokens"] <= preset.prose_max
    _, body = await post(
        http, off_sim.url + "/v1/chat/completions", {**CHAT, "max_completion_tokens": 3}
    )
    assert body["usage"]["completion_tokens"] == 3
    _, body = await post(http, off_sim.url + "/v1/chat/completions", {**CHAT, "n_predict": 2})
    assert body["usage"]["completion_tokens"] == 2


async def test_chat_stream_shape(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    events = await sse(
        http, spec_sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": 25, "stream": True}
    )
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    tokens = chunks[1:-1]
    assert len(tokens) == 25  # one chunk per token, even when a step accepted several
    assert all("content" in c["choices"][0]["delta"] and "timings" not in c for c in tokens)
    final = chunks[-1]
    assert final["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    assert final["timings"]["predicted_n"] == 25 and "usage" not in final
    assert {c["id"] for c in chunks} == {final["id"]}


async def test_include_usage_moves_timings(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    body = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    events = await sse(http, spec_sim.url + "/v1/chat/completions", body)
    finish, usage = json.loads(events[-3][1]), json.loads(events[-2][1])
    assert finish["choices"][0]["finish_reason"] == "length" and "timings" not in finish
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["timings"]["predicted_n"] == 5


async def test_timings_per_token(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    body = {**CHAT, "max_tokens": 12, "stream": True, "timings_per_token": True}
    events = await sse(http, spec_sim.url + "/v1/chat/completions", body)
    chunks = [json.loads(d) for _, d in events[1:-1]]
    counts = [c["timings"]["predicted_n"] for c in chunks]
    assert len(counts) == 13  # 12 tokens + the final chunk, all with timings
    assert counts == sorted(counts) and counts[-1] == 12


# --- other APIs ----------------------------------------------------------------------------------


async def test_completions(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    url = spec_sim.url + "/v1/completions"
    status, body = await post(http, url, {"prompt": "Once upon a time", "max_tokens": 6})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] and body["timings"]["predicted_n"] == 6
    events = await sse(http, url, {"prompt": "Once upon a time", "max_tokens": 6, "stream": True})
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert len(chunks) == 7 and all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-1]
    assert "timings" not in chunks[0]


async def test_responses(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    url = spec_sim.url + "/v1/responses"
    body = {"input": "Say hello", "instructions": "Be brief.", "max_output_tokens": 7}
    status, resp = await post(http, url, body)
    assert status == 200 and resp["object"] == "response" and resp["status"] == "completed"
    assert resp["usage"]["output_tokens"] == 7 and "timings" not in resp
    events = await sse(http, url, {**body, "stream": True})
    names = [n for n, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names.count("response.output_text.delta") == 7
    assert names[-1] == "response.completed"
    data = [json.loads(d) for _, d in events]
    assert all("timings" not in d for d in data[:-1])
    assert data[-1]["timings"]["predicted_n"] == 7
    text = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    assert data[-1]["response"]["output"][0]["content"][0]["text"] == text


async def test_anthropic_messages(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    url = spec_sim.url + "/v1/messages"
    body = {
        "model": "claude-like",
        "system": [{"type": "text", "text": "You are terse."}],
        "max_tokens": 9,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
    }
    status, msg = await post(http, url, body)
    assert status == 200 and msg["type"] == "message" and msg["stop_reason"] == "max_tokens"
    assert msg["usage"]["output_tokens"] == 9 and "timings" not in msg
    assert set(msg["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    events = await sse(http, url, {**body, "stream": True})
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names.count("content_block_delta") == 9
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(d) for _, d in events]
    assert all("timings" not in d for d in data)
    assert data[-2]["usage"]["output_tokens"] == 9
    assert data[0]["message"]["usage"]["cache_read_input_tokens"] > 0  # same prompt as above


# --- errors --------------------------------------------------------------------------------------


async def test_bad_requests(http: aiohttp.ClientSession, off_sim: Sim) -> None:
    async with http.post(off_sim.url + "/v1/chat/completions", data=b"{not json") as r:
        assert r.status == 400
        body = await r.json()
        assert body["error"]["code"] == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = await post(http, off_sim.url + "/v1/chat/completions", {"messages": []})
    assert status == 400 and "messages" in body["error"]["message"]
    status, body = await post(
        http, off_sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": "x"}
    )
    assert status == 400
    status, body = await post(
        http, off_sim.url + "/v1/completions", {"prompt": "word " * 40000}
    )  # ~40k tokens > 32k context of the fast preset
    assert status == 400 and body["error"]["type"] == "exceed_context_size_error"
    async with http.get(off_sim.url + "/no/such/path") as r:
        assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
    deep = b'{"messages":' + b"[" * 5000 + b"]" * 5000 + b"}"  # deeper than the decoder's stack
    async with http.post(off_sim.url + "/v1/messages", data=deep) as r:
        assert r.status == 400


# --- slots, cache, concurrency -------------------------------------------------------------------


async def slots(http: aiohttp.ClientSession, sim: Sim) -> list[dict[str, Any]]:
    async with http.get(sim.url + "/slots") as r:
        result: list[dict[str, Any]] = await r.json()
        return result


async def test_introspection(http: aiohttp.ClientSession, spec_sim: Sim, off_sim: Sim) -> None:
    for path in ("/v1/models", "/models"):
        async with http.get(spec_sim.url + path) as r:
            assert (await r.json())["data"][0]["owned_by"] == "llamacpp"
    async with http.get(spec_sim.url + "/props") as r:
        props = await r.json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"
    assert props["default_generation_settings"]["params"]["speculative.n_max"] == 3
    spec_slots = await slots(http, spec_sim)
    assert [s["id"] for s in spec_slots] == [0, 1]
    assert all(s["speculative"] for s in spec_slots)
    assert [s["speculative"] for s in await slots(http, off_sim)] == [False]
    async with http.get(spec_sim.url + "/v1/health") as r:
        assert await r.json() == {"status": "ok"}


async def test_tokenize_detokenize(http: aiohttp.ClientSession, off_sim: Sim) -> None:
    text = "def main():\n    return 42  # answer"
    _, body = await post(http, off_sim.url + "/tokenize", {"content": text})
    tokens = body["tokens"]
    assert all(isinstance(t, int) for t in tokens) and 8 <= len(tokens) <= 14
    _, pieces = await post(http, off_sim.url + "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == tokens
    assert "".join(p["piece"] for p in pieces["tokens"]) == text
    _, back = await post(http, off_sim.url + "/detokenize", {"tokens": tokens})
    assert back == {"content": text}


async def test_prefix_cache_on_the_next_turn(http: aiohttp.ClientSession, off_sim: Sim) -> None:
    first = {"messages": [{"role": "user", "content": "Explain tides to a child, please."}]}
    _, one = await post(http, off_sim.url + "/v1/chat/completions", {**first, "max_tokens": 30})
    answer = one["choices"][0]["message"]["content"]
    history = [*first["messages"], {"role": "assistant", "content": answer}]
    second = {"messages": [*history, {"role": "user", "content": "And on Mars?"}]}
    _, two = await post(http, off_sim.url + "/v1/chat/completions", {**second, "max_tokens": 5})
    t1, t2 = one["timings"], two["timings"]
    assert t2["cache_n"] >= t1["prompt_n"] + t1["predicted_n"] - 1
    assert t2["prompt_n"] < 20
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == t2["cache_n"]


async def test_disconnect_frees_the_slot_at_once(http: aiohttp.ClientSession) -> None:
    # real time: setup-b decodes ~39 tok/s, so this request would take ~25 s
    with simulator("--preset", "setup-b", *MAX3) as sim:
        body = {**CHAT, "max_tokens": 1000, "stream": True}
        async with http.post(sim.url + "/v1/chat/completions", json=body) as r:
            await r.content.readline()
            await r.content.readline()
            assert (await slots(http, sim))[0]["is_processing"] is True
            r.connection.transport.abort()  # type: ignore[union-attr]
        left = time.monotonic()
        while (await slots(http, sim))[0]["is_processing"]:
            assert time.monotonic() - left < 0.5
            await asyncio.sleep(0.01)
        # and the freed slot serves the next request straight away
        status, body = await post(http, sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": 1})
        assert status == 200


async def test_requests_beyond_the_slots_wait_in_order(
    http: aiohttp.ClientSession, off_sim: Sim
) -> None:
    async def timed(tag: str) -> tuple[float, str]:
        body = {"messages": [{"role": "user", "content": tag}], "max_tokens": 150}
        await post(http, off_sim.url + "/v1/chat/completions", body)
        return time.monotonic(), tag

    first = asyncio.create_task(timed("first"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(timed("second"))
    (t1, _), (t2, _) = await asyncio.gather(first, second)
    # one slot, ~65 ms per request at 2,400 tok/s: the second one finishes ~one request later
    assert t2 - t1 > 0.03


# --- health, metrics, signals --------------------------------------------------------------------


async def test_health_is_503_while_loading(http: aiohttp.ClientSession) -> None:
    with simulator("--preset", "fast", "--load-time", "1.0", wait_ready=False) as sim:
        async with http.get(sim.url + "/health") as r:
            assert r.status == 503
            assert await r.json() == {
                "error": {"message": "Loading model", "type": "unavailable_error", "code": 503}
            }
        async with http.post(sim.url + "/v1/chat/completions", json=CHAT) as r:
            assert r.status == 503
        await asyncio.sleep(1.1)
        async with http.get(sim.url + "/health") as r:
            assert r.status == 200 and await r.json() == {"status": "ok"}


async def test_metrics(http: aiohttp.ClientSession, spec_sim: Sim, off_sim: Sim) -> None:
    async with http.get(off_sim.url + "/metrics") as r:
        assert r.status == 501 and (await r.json())["error"]["type"] == "not_supported_error"
    async with http.get(spec_sim.url + "/metrics") as r:
        before = metric_values(await r.text())
    await post(http, spec_sim.url + "/v1/chat/completions", {**CHAT, "max_tokens": 30})
    async with http.get(spec_sim.url + "/metrics") as r:
        assert r.status == 200
        after = metric_values(await r.text())
    for name in (
        "prompt_tokens_total",
        "tokens_predicted_total",
        "requests_processing",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "spec_decode_num_drafts_total",
    ):
        assert f"llamacpp:{name}" in after
    assert (
        after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 30
    )
    assert (
        after["llamacpp:spec_decode_num_drafts_total"]
        > before["llamacpp:spec_decode_num_drafts_total"]
    )
    per_pos = [
        after[f"llamacpp:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for i in range(3)
    ]
    assert per_pos == sorted(per_pos, reverse=True)
    assert sum(per_pos) == after["llamacpp:spec_decode_num_accepted_tokens_total"]


def test_sigterm_exits_cleanly() -> None:
    with simulator(
        "--preset", "fast", "-ngl", "99", "-fa", "on", "-md", "d.gguf", "-ctk", "q8_0"
    ) as sim:
        sim.proc.send_signal(signal.SIGTERM)
        assert sim.proc.wait(10) == 0


# --- calibration through the real process ---------------------------------------------------------


async def mean_speed(http: aiohttp.ClientSession, sim: Sim, n: int) -> tuple[float, float]:
    """Mean timings.predicted_per_second and the draft acceptance over n greeting requests."""
    speeds, drafted, accepted = [], 0, 0
    for _ in range(n):
        body = {**CHAT, "max_tokens": 128, "ignore_eos": True}
        _, out = await post(http, sim.url + "/v1/chat/completions", body)
        t = out["timings"]
        speeds.append(t["predicted_per_second"])
        drafted += t.get("draft_n", 0)
        accepted += t.get("draft_n_accepted", 0)
    return sum(speeds) / n, accepted / drafted if drafted else 0.0


async def test_setup_b_greeting_speedup_over_http(http: aiohttp.ClientSession) -> None:
    # Published: off 38.86 tok/s, n_max 3 1.71x on greetings (docs/published-figures.md#setup-b).
    common = ("--preset", "setup-b", "--time-scale", "400", "--latent-sigma", "0")
    with simulator(*common) as off, simulator(*common, *MAX3) as on:
        off_speed, _ = await mean_speed(http, off, 8)
        on_speed, acceptance = await mean_speed(http, on, 8)
        _, predicted = await post(http, on.url + "/sim/predict", {**CHAT, "max_tokens": 128})
    assert off_speed == pytest.approx(38.86, rel=0.01)
    assert on_speed / off_speed == pytest.approx(1.71, rel=0.05)
    assert on_speed == pytest.approx(predicted["decode_tok_s"], rel=0.05)
    assert acceptance == pytest.approx(predicted["acceptance"], abs=0.05)


async def test_time_scale_paces_the_wall_clock(http: aiohttp.ClientSession) -> None:
    with simulator("--preset", "setup-b", "--time-scale", "10") as sim:
        body = {**CHAT, "max_tokens": 39, "ignore_eos": True}
        start = time.monotonic()
        _, out = await post(http, sim.url + "/v1/chat/completions", body)
        wall = time.monotonic() - start
    simulated = (out["timings"]["prompt_ms"] + out["timings"]["predicted_ms"]) / 1e3
    assert simulated == pytest.approx(1.0 + 0.015, abs=0.05)  # 39 tokens at 38.9 tok/s + prefill
    assert simulated / 10 * 0.9 <= wall <= simulated / 10 + 0.25


async def test_sim_predict(http: aiohttp.ClientSession, spec_sim: Sim) -> None:
    url = spec_sim.url + "/sim/predict"
    fresh = {"messages": [{"role": "user", "content": "A brand new question about owls"}]}
    _, cold = await post(http, url, {**fresh, "max_tokens": 64})
    assert cold["cache_n"] < 5 and cold["draft"]["n_max"] == 3  # only the template's head
    _, off = await post(http, url, {**fresh, "max_tokens": 64, "draft": "off"})
    assert off["acceptance"] == 0.0 and off["decode_tok_s"] < cold["decode_tok_s"]
    await post(http, spec_sim.url + "/v1/chat/completions", {**fresh, "max_tokens": 4})
    _, warm = await post(http, url, {**fresh, "max_tokens": 64})
    assert warm["cache_n"] == warm["prompt_tokens"] - 1 and warm["prefill_s"] < cold["prefill_s"]
    preset = load_preset("fast")
    expected = model.predict(
        preset, DraftSettings("draft-mtp", 3), cold["prompt_tokens"], cold["cache_n"],
        model.Kind.PROSE,
        model.latent_factor(0, "", 0.0), 64,
    )  # fmt: skip
    assert cold["decode_tok_s"] == pytest.approx(expected.decode_tok_s, rel=0.35)  # latent spread
    status, _ = await post(http, url, {**fresh, "api": "nope"})
    assert status == 400


# --- official SDKs as clients -------------------------------------------------------------------


async def test_official_sdks_parse_the_streams(spec_sim: Sim) -> None:
    import anthropic  # heavy imports, only here
    import openai

    oai = openai.AsyncOpenAI(base_url=spec_sim.url + "/v1", api_key="none")
    stream = await oai.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = [c async for c in stream]
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert text
    resp = await oai.responses.create(model="x", input="Hello", max_output_tokens=5)
    assert resp.output_text and resp.usage is not None and resp.usage.output_tokens == 5
    await oai.close()

    claude = anthropic.AsyncAnthropic(base_url=spec_sim.url, api_key="none")
    async with claude.messages.stream(
        model="x", max_tokens=7, messages=[{"role": "user", "content": "Hello"}]
    ) as s:
        final = await s.get_final_message()
    assert final.usage.output_tokens == 7 and final.stop_reason == "max_tokens"
    assert final.content[0].type == "text" and final.content[0].text
    await claude.close()


def test_version_answers_as_llama_server_does_and_exits() -> None:
    """`--version` among a launch's flags prints the build in llama-server's words and exits:
    the proxy reads it to key what it learned (proxy.plans.learned_keys); a twin that started
    serving instead held the proxy's start for the read's whole timeout."""
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "--preset", "setup-b", "-np", "2", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("version: simulator "), done.stderr
    assert "\nbuilt with Python " in done.stderr

"""End to end: the official SDKs -> `mtp-proxy serve` -> three real llama-server processes.

The pool serves a tiny qwen35 model whose MTP block drafts exactly what the trunk would say
(acceptance 100%), under the profiles off, min (draft-mtp n_max 2 / n_min 1) and max (n_max 3),
with the family's real chat template (Qwen3.5-4B.jinja from the pinned sdist, thinking on).
Each test pins a profile with X-MTP-Profile so it knows which backend answers. The measured
figures (draft_n and acceptance per profile) are printed (`pytest -s`) and recorded as properties.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.support.chat_templates import QWEN35, template_args
from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy
from tests.support.llama_pool import (
    ARGS,
    MODEL,
    admin_backends,
    identity_model,
    llama_config,
    llama_model,
)

pytestmark = pytest.mark.llama

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello world"}]
SPECULATIVE = ("min", "max")
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = identity_model(tmp_path_factory.mktemp("models"))
    # The real Qwen3.5 chat template (the model family's own), thinking on as it ships.
    served = llama_model(model, args=[*ARGS, *template_args(QWEN35)])
    config = llama_config(model, models=[served])
    with running_proxy(config, tmp_path_factory.mktemp("e2e")) as running:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = running.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
            if all(row["state"] == "ready" for row in rows):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"backends not all ready after 30 s: {rows}")
        yield running


def openai_client(proxy: ProxyProcess, profile: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key="unused", default_headers={"X-MTP-Profile": profile}
    )


async def backend_counters(proxy: ProxyProcess, profile: str) -> dict[str, float]:
    """The backend's own llamacpp:spec_decode_* totals, read from its /metrics directly."""
    async with aiohttp.ClientSession() as session:
        row = (await admin_backends(session, proxy))[f"{MODEL}/{profile}"]
        async with session.get(row["url"] + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (DRAFTED, ACCEPTED)
    }


def test_pool_is_three_ready_llama_servers(proxy: ProxyProcess) -> None:
    status, health = proxy.get_json("/health")
    assert (status, health["ready_backends"]) == (200, {MODEL: 3})
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    assert {row["profile"]: row["state"] for row in rows} == {
        "off": "ready",
        "min": "ready",
        "max": "ready",
    }
    for row in rows:  # each a llama-server process of its own, on its own port
        cmdline = Path(f"/proc/{row['pid']}/cmdline").read_bytes().split(b"\0")
        assert Path(cmdline[0].decode()).name == "llama-server"
        assert cmdline[cmdline.index(b"--port") + 1] == str(row["port"]).encode()
    assert len({row["pid"] for row in rows}) == 3


async def test_openai_sdk_non_stream_each_profile(
    proxy: ProxyProcess, record_property: Any
) -> None:
    texts = {}
    for profile in ("off", "min", "max"):
        client = openai_client(proxy, profile)
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=64,
            temperature=0,
        )
        await client.close()
        assert raw.headers["X-MTP-Backend"] == f"{MODEL}/{profile}"
        assert raw.headers["X-MTP-Route-Reason"] == "pinned"
        completion = raw.parse()
        # The Qwen3.5 template opens a thinking block the tiny model never closes: the answer
        # is reasoning_content (content stays empty). Greedy either way.
        message = completion.choices[0].message
        texts[profile] = (message.model_extra or {}).get("reasoning_content", "") + (
            message.content or ""
        )
        assert completion.usage is not None and completion.usage.completion_tokens == 64
        timings = (completion.model_extra or {})["timings"]
        if profile == "off":
            assert "draft_n" not in timings  # llama-server omits it when nothing was drafted
            continue
        acceptance = timings["draft_n_accepted"] / timings["draft_n"]
        print(f"\n{profile}: draft_n {timings['draft_n']}, acceptance {acceptance:.3f}")
        record_property(f"draft_n {profile}", timings["draft_n"])
        record_property(f"acceptance {profile}", acceptance)
        assert timings["draft_n"] > 0
        assert acceptance == 1.0  # the identity MTP block drafts what the trunk says
    # Speculation never changes greedy output: the three backends agree word for word.
    assert texts["off"] and texts["off"] == texts["min"] == texts["max"]


async def test_openai_sdk_stream_carries_timings_on_the_last_chunk(proxy: ProxyProcess) -> None:
    for profile in ("off", "max"):
        client = openai_client(proxy, profile)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=48,
            temperature=0,
            stream=True,
            # Thinking off, as a client may ask of Qwen3.5's template: the answer is text.
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(text) > 0
        assert chunks[-1].choices[0].finish_reason == "length"
        timings = (chunks[-1].model_extra or {})["timings"]
        assert timings["predicted_n"] == 48
        if profile == "off":
            assert "draft_n" not in timings
        else:
            assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]


async def test_anthropic_sdk_stream(proxy: ProxyProcess) -> None:
    for profile in ("off", "min"):
        client = anthropic.AsyncAnthropic(
            base_url=proxy.url, api_key="unused", default_headers={"X-MTP-Profile": profile}
        )
        async with client.messages.stream(
            model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "hello world"}]
        ) as stream:
            # Thinking on (Qwen3.5's default): the tiny model's whole answer is a thinking block.
            deltas = [
                event.thinking if event.type == "thinking" else event.text
                async for event in stream
                if event.type in ("thinking", "text")
            ]
            final = await stream.get_final_message()
        await client.close()
        assert [block.type for block in final.content] == ["thinking"], final.content
        assert "".join(deltas) == final.content[0].thinking != ""
        assert final.stop_reason == "max_tokens"
        assert final.usage.output_tokens == 24


async def test_backend_spec_counters_move_only_where_speculating(proxy: ProxyProcess) -> None:
    for profile in ("off", "min", "max"):
        before = await backend_counters(proxy, profile)
        client = openai_client(proxy, profile)
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=40,
            temperature=0,
        )
        await client.close()
        after = await backend_counters(proxy, profile)
        drafted = after[DRAFTED] - before[DRAFTED]
        accepted = after[ACCEPTED] - before[ACCEPTED]
        timings = (completion.model_extra or {})["timings"]
        if profile == "off":
            assert (drafted, accepted) == (0, 0)
        else:
            # The request ran alone on its backend: the counters moved by exactly its drafts.
            assert drafted == timings["draft_n"] > 0
            assert accepted == timings["draft_n_accepted"] == drafted


async def test_proxy_metrics_count_the_drafts_it_relayed(proxy: ProxyProcess) -> None:
    async def proxy_drafts() -> dict[tuple[str, str], float]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(proxy.url + "/metrics") as response,
        ):
            text = await response.text()
        return {
            (sample.name, sample.labels["profile"]): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name
            in ("mtp_proxy_draft_tokens_total", "mtp_proxy_draft_accepted_tokens_total")
        }

    before = await proxy_drafts()
    seen = {profile: 0 for profile in SPECULATIVE}
    for profile in SPECULATIVE:
        client = openai_client(proxy, profile)
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=32,
            temperature=0,
        )
        await client.close()
        seen[profile] = (completion.model_extra or {})["timings"]["draft_n"]
    after = await proxy_drafts()
    for profile in SPECULATIVE:
        key = ("mtp_proxy_draft_tokens_total", profile)
        assert after[key] - before.get(key, 0.0) == seen[profile] > 0
        accepted = ("mtp_proxy_draft_accepted_tokens_total", profile)
        assert after[accepted] - before.get(accepted, 0.0) == seen[profile]
    off = ("mtp_proxy_draft_tokens_total", "off")
    assert after.get(off, 0.0) == before.get(off, 0.0) == 0.0

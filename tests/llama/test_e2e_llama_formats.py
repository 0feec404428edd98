"""Real llama-server formats of `/v1/completions` and `/v1/responses`, through the proxy.

The pool of tests/support/llama_pool.py (three real llama-server processes, a tiny qwen35
model whose MTP block drafts exactly what the trunk says: acceptance 100%), with the family's
real chat template (Qwen3.5-4B.jinja from the pinned sdist). For each answer the
test reads the figures llama-server itself reported (its `timings`, or its own /metrics counters
where an API carries none) and checks that the proxy's log line for that request says the same: the
proxy parsed the real bytes, not only the fixtures and the simulator.

What carries timings on this build (checked here): `/v1/completions` in the body or
on the final chunk; `/v1/responses` on its `response.completed` event when streaming, nowhere
when not (the proxy then takes the drafts from the backend's /metrics counters).
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.chat_templates import QWEN35, template_args
from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy
from tests.support.llama_pool import ARGS, MODEL, identity_model, llama_config, llama_model

pytestmark = pytest.mark.llama

PROMPT = "hello world"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = identity_model(tmp_path_factory.mktemp("models"))
    # The real Qwen3.5 chat template (the model family's own), thinking on as it ships.
    served = llama_model(model, args=[*ARGS, *template_args(QWEN35)])
    config = llama_config(model, models=[served])
    with running_proxy(config, tmp_path_factory.mktemp("formats")) as running:
        deadline = time.monotonic() + 60
        while not all(row["state"] == "ready" for row in backends(running).values()):
            assert time.monotonic() < deadline, f"backends not all ready: {backends(running)}"
            time.sleep(0.05)
        yield running


def backends(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return {row["profile"]: row for row in rows}


def post(proxy: ProxyProcess, path: str, body: dict[str, Any], profile: str) -> tuple[str, bytes]:
    """(request id, raw answer) of one request pinned to `profile`."""
    request_id = uuid.uuid4().hex
    request = urllib.request.Request(
        proxy.url + path,
        data=json.dumps({"model": MODEL, "temperature": 0, **body}).encode(),
        headers={
            "Content-Type": "application/json",
            "X-MTP-Profile": profile,
            "X-Request-Id": request_id,
        },
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        assert response.headers["X-MTP-Backend"] == f"{MODEL}/{profile}"
        return request_id, response.read()


def events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE stream (named events or not), [DONE] left out."""
    payloads = []
    for line in raw.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            payloads.append(json.loads(line[5:]))
    return payloads


def logged(proxy: ProxyProcess, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proxy.log_lines():
            if line.get("event") == "request" and line.get("request_id") == request_id:
                return line
        time.sleep(0.02)
    raise AssertionError(f"no log line for {request_id}")


def assert_logged_as_reported(line: dict[str, Any], timings: dict[str, Any]) -> None:
    """The proxy's record of a request says what llama-server's timings said."""
    assert line["output_tokens"] == timings["predicted_n"]
    assert line["context_tokens"] == timings["prompt_n"] + timings["cache_n"]
    # The proxy's decode speed is predicted_n over predicted_ms (llama-server's own
    # predicted_per_second differs from that by a token on this build: n - 1 over the time).
    decode = timings["predicted_n"] / (timings["predicted_ms"] / 1000.0)
    assert line["decode_tok_s"] == pytest.approx(decode, rel=1e-6), timings
    if "draft_n" not in timings:  # llama-server omits them when nothing was drafted
        assert (line["draft_n"], line["acceptance"]) == (0, None), line
        return
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"]
    assert (line["draft_n"], line["draft_accepted"]) == (
        timings["draft_n"],
        timings["draft_n_accepted"],
    )
    assert line["acceptance"] == 1.0  # the identity MTP block


@pytest.mark.parametrize("profile", ["off", "max"])
def test_completions_non_stream_timings(proxy: ProxyProcess, profile: str) -> None:
    body = {"prompt": PROMPT, "max_tokens": 40}
    request_id, raw = post(proxy, "/v1/completions", body, profile)
    answer = json.loads(raw)
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"]
    assert_logged_as_reported(logged(proxy, request_id), answer["timings"])


@pytest.mark.parametrize("profile", ["off", "min"])
def test_completions_stream_timings_on_the_final_chunk(proxy: ProxyProcess, profile: str) -> None:
    body = {"prompt": PROMPT, "max_tokens": 40, "stream": True}
    request_id, raw = post(proxy, "/v1/completions", body, profile)
    chunks = events(raw)
    assert raw.rstrip().endswith(b"data: [DONE]")
    timed = [chunk for chunk in chunks if "timings" in chunk]
    assert timed and timed[-1] is chunks[-1]  # on the last chunk
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert_logged_as_reported(logged(proxy, request_id), timed[-1]["timings"])


@pytest.mark.parametrize("profile", ["off", "max"])
def test_responses_stream_timings_on_response_completed(proxy: ProxyProcess, profile: str) -> None:
    body = {"input": PROMPT, "max_output_tokens": 40, "stream": True}
    request_id, raw = post(proxy, "/v1/responses", body, profile)
    payloads = events(raw)
    assert payloads[-1]["type"] == "response.completed"
    timed = [p for p in payloads if "timings" in p]
    assert timed, f"no timings in the stream: {[p.get('type') for p in payloads]}"
    assert_logged_as_reported(logged(proxy, request_id), timed[-1]["timings"])


def backend_counters(proxy: ProxyProcess, profile: str) -> tuple[float, float]:
    with urllib.request.urlopen(backends(proxy)[profile]["url"] + "/metrics") as response:
        text = response.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values[DRAFTED], values[ACCEPTED]


def test_responses_non_stream_has_no_timings_and_acceptance_comes_from_the_counters(
    proxy: ProxyProcess,
) -> None:
    body = {"input": PROMPT, "max_output_tokens": 40}
    lines = []
    for _ in range(2):  # the first reading of a backend's counters only sets a baseline
        before = backend_counters(proxy, "max")
        request_id, raw = post(proxy, "/v1/responses", body, "max")
        answer = json.loads(raw)
        assert answer["object"] == "response" and answer["status"] == "completed"
        assert "timings" not in answer
        line = logged(proxy, request_id)
        after = backend_counters(proxy, "max")
        lines.append((line, after[0] - before[0], after[1] - before[1]))
    line, drafted, accepted = lines[-1]
    assert drafted > 0 and accepted == drafted
    assert (line["draft_n"], line["draft_accepted"], line["acceptance"]) == (
        drafted,
        accepted,
        1.0,
    )
    assert line["output_tokens"] == answer["usage"]["output_tokens"]


async def test_openai_sdk_reads_both_apis_through_the_proxy(proxy: ProxyProcess) -> None:
    client = openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key="unused", default_headers={"X-MTP-Profile": "min"}
    )
    completion = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16)
    assert completion.choices[0].text and completion.usage is not None
    assert completion.usage.completion_tokens == 16
    stream = await client.responses.create(
        model=MODEL, input=PROMPT, max_output_tokens=16, stream=True
    )
    kinds = [event.type async for event in stream]
    await client.close()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    # Qwen3.5's template opens a thinking block the tiny model never closes: reasoning deltas.
    assert "response.reasoning_text.delta" in kinds

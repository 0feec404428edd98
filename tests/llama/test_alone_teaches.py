"""Every non-stream /v1/messages or /v1/responses request that ran alone teaches something, on the
real patched llama-server through the proxy: its answer carries no ``timings``, so its drafts
and decode speed come from the backend's /metrics counters around it (and its decode clock).

A client that sends its next request the moment an answer arrives (an agent's loop) used to
find the counters read too late: the next request was already on the backend, the reading was
not that request's alone, and 7 of 12 such requests taught nothing. The tiny qwen35 model's MTP
block drafts what its trunk says, so every request at a depth drafts.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.llama_pool import MODEL, identity_model, llama_config, llama_model

pytestmark = pytest.mark.llama

PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]
REQUESTS = 12
TOKENS = 24


def config(model: Path) -> dict[str, Any]:
    entry = llama_model(model, profiles=PROFILES, draft_control="per-request")
    entry["binary"] = patched_llama_server_binary()
    proxy = llama_config(model, models=[entry])
    # No exploration, no start-up calibration: every request runs at the cold rule's depth 3.
    proxy["routing"] = {"calibrate": "off", "exploration_rate": 0.0, "cold_exploration_rate": 0.0}
    return proxy


def post(proxy: ProxyProcess, api: str, n: int) -> None:
    text = f"hello world number {n}"
    body: dict[str, Any] = {"model": MODEL, "temperature": 0}
    if api == "responses":
        path = "/v1/responses"
        body |= {"input": text, "max_output_tokens": TOKENS}
    else:
        path = "/v1/messages"
        body |= {"messages": [{"role": "user", "content": text}], "max_tokens": TOKENS}
    request = urllib.request.Request(
        proxy.url + path, data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        response.read()


def request_lines(proxy: ProxyProcess, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The request log lines, once ``count`` are written (each waits for its counters)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in proxy.log_lines() if line.get("event") == "request"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_each_request_that_ran_alone_yields_its_speed_and_drafts(tmp_path: Path) -> None:
    model = identity_model(tmp_path / "models")
    with running_proxy(config(model), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=120)
        for n in range(REQUESTS):  # one at a time, each sent as soon as the last answered
            post(proxy, ("messages", "responses")[n % 2], n)
        lines = request_lines(proxy, REQUESTS)
    taught = [(line.get("api"), line["draft_n"], line["decode_tok_s"]) for line in lines]
    assert len(lines) == REQUESTS, taught
    assert {line["profile"] for line in lines} == {"max"}, lines
    missing = [t for t in taught if t[1] is None or t[2] is None]
    assert not missing, f"{len(missing)} of {REQUESTS} taught nothing: {taught}"
    assert all(t[1] > 0 and t[2] > 0 for t in taught), taught

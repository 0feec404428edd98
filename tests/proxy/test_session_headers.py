"""The agents' own session headers as session keys on a real proxy: Claude Code's, X-Session-Id
and Codex's `session_id` (an underscore: aiohttp takes it, nginx only with
`underscores_in_headers on`), each the key its requests are routed and listed by, and
X-MTP-Session before them all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import body_for, send


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = simulator_model(draft_control="per-request", time_scale=50.0, slots=2)
    config = proxy_config([model], routing={"clock_scale": 50.0, "seed": 1})
    with running_proxy(config, tmp_path_factory.mktemp("session-headers")) as running:
        wait_all_ready(running, {"mtp-demo": 1})
        yield running


@pytest.mark.parametrize(
    ("headers", "session"),
    [
        ({"X-Claude-Code-Session-Id": "claude-7"}, "claude-7"),
        ({"X-Session-Id": "generic-7"}, "generic-7"),
        ({"session_id": "codex-7"}, "codex-7"),
        ({"session_id": "codex-8", "X-MTP-Session": "ours-8"}, "ours-8"),
    ],
)
def test_an_agents_session_header_is_the_session_key(
    proxy: ProxyProcess, headers: dict[str, str], session: str
) -> None:
    sent = send(proxy.url, "chat", body_for("chat", stream=False), headers=headers)
    assert sent.status == 200
    status, answer = proxy.get_json("/admin/requests", admin_key=ADMIN_KEY)
    assert status == 200
    rows = {row["request_id"]: row for row in answer["requests"]}
    assert rows[sent.request_id]["session"] == session


def test_without_one_the_key_is_derived_from_the_body(proxy: ProxyProcess) -> None:
    sent = send(proxy.url, "chat", body_for("chat", stream=False), headers={"X-Other": "x"})
    rows = {
        r["request_id"]: r
        for r in proxy.get_json("/admin/requests", admin_key=ADMIN_KEY)[1]["requests"]
    }
    derived = rows[sent.request_id]["session"]
    assert derived and derived not in ("x", "claude-7", "generic-7", "codex-7")

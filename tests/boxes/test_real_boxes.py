"""Two boxes on the real patched llama-server (Gemma 3 270M, ngram-mod at depth 8, -t 1) behind
nginx with the shipped deploy/balancers/nginx.conf: sessions stay on their box, answers carry the
real depth and speculative type, /health counts each box's real slots, and with one box killed
its sessions are served by the other."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.support.boxes import MODEL, Balancer, behind, kill
from tests.support.harness import ProxyProcess
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.real_models import GEMMA3_270M, real_model

pytestmark = pytest.mark.llama

SESSIONS = [f"real-session-{n}" for n in range(5)]
CHAT = [{"role": "user", "content": "Count from one to ten."}]


def real_model_config() -> dict[str, Any]:
    return {
        "name": MODEL,
        "backend": "llama-server",
        "binary": patched_llama_server_binary(),
        "model_path": str(real_model(GEMMA3_270M)),
        "args": ["-c", "1024", "-np", "1", "-t", "1"],
        "profiles": [{"name": "ngram", "spec_type": "ngram-mod", "draft_n_max": 8}],
    }


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Balancer, list[ProxyProcess]]]:
    workdir = tmp_path_factory.mktemp("real-boxes")
    with behind("nginx", workdir, real_model_config()) as running:
        yield running


async def chat(
    session: aiohttp.ClientSession, balancer: Balancer, key: str
) -> tuple[int, dict[str, str]]:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "stream": True}
    async with session.post(
        balancer.url + "/v1/chat/completions", json=body, headers={"X-MTP-Session": key}
    ) as response:
        raw = await response.read()
        assert raw.rstrip().endswith(b"[DONE]"), raw[-200:]
        return response.status, dict(response.headers)


def served(balancer: Balancer) -> dict[str, set[tuple[str, str, str]]]:
    async def ask() -> dict[str, set[tuple[str, str, str]]]:
        seen: dict[str, set[tuple[str, str, str]]] = {}
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                for key in SESSIONS:
                    status, headers = await chat(session, balancer, key)
                    assert status == 200
                    where = (
                        # the box that answered: nginx lists a dead one it tried first before it
                        headers["X-Served-By"].split(",")[-1].strip(),
                        headers["X-MTP-Depth"],
                        headers["X-MTP-Spec-Type"],
                    )
                    seen.setdefault(key, set()).add(where)
        return seen

    return asyncio.run(ask())


def test_real_boxes_keep_sessions_and_say_their_depth(
    stack: tuple[Balancer, list[ProxyProcess]],
) -> None:
    balancer, boxes = stack
    for box in boxes:
        status, health = box.get_json("/health")
        assert status == 200 and health["models"][MODEL]["slots_total"] == 1
    seen = served(balancer)
    assert all(len(where) == 1 for where in seen.values()), seen
    answers = set().union(*seen.values())
    assert {depth for _, depth, _ in answers} == {"8"}
    assert {spec for _, _, spec in answers} == {"ngram-mod"}
    assert {addr for addr, _, _ in answers} == {f"127.0.0.1:{box.port}" for box in boxes}
    kill(boxes[1])
    after = set().union(*served(balancer).values())
    assert {addr for addr, _, _ in after} == {f"127.0.0.1:{boxes[0].port}"}

"""The real llama-server keeps a slot's context in host memory when another prompt takes the slot
(--cache-ram, on by default), and the simulator does as it does (tests/test_simulator_prompt_cache
.py): an agent's next turn after a chat on its only slot reuses its context, unless --cache-ram 0.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.llama_fixtures import LLAMA, LlamaServer, make_models, running_llama_server

pytestmark = pytest.mark.llama

AGENT = " ".join(f"def function_{i}(x):\n    return x * {i}\n" for i in range(40))


def complete(server: LlamaServer, prompt: str, n: int = 4) -> dict[str, Any]:
    body = json.dumps({"prompt": prompt, "n_predict": n, "cache_prompt": True}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/completion",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@pytest.mark.parametrize("cache_ram", [None, "0"])
def test_an_agent_turn_after_a_chat_on_its_only_slot_reuses_its_context(
    cache_ram: str | None, tmp_path: Path
) -> None:
    models = make_models(tmp_path / "models")
    args = () if cache_ram is None else ("--cache-ram", cache_ram)
    with running_llama_server(
        models[LLAMA], *args, log_dir=tmp_path / "logs", parallel=1
    ) as server:
        first = complete(server, AGENT)
        complete(server, "Hello there, how are you?")  # the only slot: LRU
        turn = complete(server, AGENT + first["content"] + "\ndef next_one(x):")
    prompt = first["timings"]["prompt_n"]
    assert prompt > 300
    if cache_ram is None:  # the default: restored from host memory
        assert turn["timings"]["cache_n"] >= prompt
    else:
        assert turn["timings"]["cache_n"] < 10

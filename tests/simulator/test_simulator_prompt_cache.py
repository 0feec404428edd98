"""The simulator's host-memory prompt cache over HTTP: an agent's turn after a chat reuses its
context unless --cache-ram is 0, and the flag reads as llama-server's (the cache itself:
tests/unit/test_simulator_prompt_cache.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import pytest

from simulator.model import restore_ms
from simulator.presets import load_preset
from tests.support.simulator_process import Sim, post, simulator


@pytest.fixture(scope="module")
def setup_b_sim() -> Iterator[Sim]:
    with simulator("--preset", "setup-b", "-np", "1", "--time-scale", "2000") as sim:
        yield sim


@pytest.fixture(scope="module")
def no_cache_sim() -> Iterator[Sim]:
    args = ("--preset", "setup-b", "-np", "1", "--time-scale", "2000", "--cache-ram", "0")
    with simulator(*args) as sim:
        yield sim


@pytest.mark.parametrize("cached", [True, False])
async def test_over_http_an_agent_turn_after_a_chat_reuses_its_context_unless_cache_ram_is_0(
    cached: bool, setup_b_sim: Sim, no_cache_sim: Sim
) -> None:
    url = (setup_b_sim if cached else no_cache_sim).url + "/v1/chat/completions"
    context = " ".join(f"def function_{i}(x): return x * {i}" for i in range(300))
    agent = [{"role": "system", "content": context}, {"role": "user", "content": "go"}]
    async with aiohttp.ClientSession() as http:
        status, first = await post(http, url, {"messages": agent, "max_tokens": 8})
        assert status == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert (await post(http, url, chat))[0] == 200
        answer = first["choices"][0]["message"]["content"]
        turn = [*agent, {"role": "assistant", "content": answer}, {"role": "user", "content": "on"}]
        status, second = await post(http, url, {"messages": turn, "max_tokens": 4})
    assert status == 200
    prompt = first["timings"]["prompt_n"]
    assert prompt > 2000
    if cached:
        assert second["timings"]["cache_n"] >= prompt
        # ... and the copy back to the GPU is paid (tens of ms, not a new prefill's seconds)
        copy_ms = restore_ms(load_preset("setup-b"), second["timings"]["cache_n"])
        assert copy_ms > 10
        assert copy_ms <= second["timings"]["prompt_ms"] < first["timings"]["prompt_ms"] / 10
    else:
        assert second["timings"]["cache_n"] < 50


def test_cache_ram_is_a_flag_like_llama_servers() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "simulator", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--cache-ram" in out and "--no-cache-idle-slots" in out
    from simulator.cli import parse_config

    assert parse_config(["--cache-ram", "0", "-ngl", "99"]).cache_ram_mib == 0
    assert parse_config(["-cram", "-1"]).cache_ram_mib == -1
    assert not parse_config(["--no-cache-idle-slots"]).cache_idle_slots
    assert parse_config([]).cache_ram_mib == 8192  # llama-server's default

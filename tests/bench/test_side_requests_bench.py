"""bench/side_requests.py, bounded (5 main turns), on the real patched llama-server and a tiny
model: with two slots and the kept slot (what init writes) a turn processes only what it added;
one slot, or two where llama-server chooses by prompt similarity (a side request under the
agent's own system prompt lands in the agent's slot), process much of it again; two slots on
unified KV without --no-cache-idle-slots lose the whole prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import side_requests
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.tinygguf import LlamaConfig, write_llama

pytestmark = pytest.mark.llama


def test_the_kept_slot_keeps_the_agents_prefix(tmp_path: Path) -> None:
    binary = patched_llama_server_binary()
    model = write_llama(tmp_path / "tiny.gguf", LlamaConfig(n_ctx=16384))
    by_name = {s.name: s for s in side_requests.SETUPS}

    def processed(name: str) -> list[int]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        turns = side_requests.replay(by_name[name], binary, model, 5, folder)
        return [t.prompt_n for t in turns[1:]]  # the first turn processes everything anyway

    kept = processed("-np 2 --kv-unified --no-cache-idle-slots, side slot 1")
    chosen = processed("-np 2 --kv-unified --no-cache-idle-slots")
    one = processed("-np 1 --cache-ram 0")
    cleared = processed("-np 2 --kv-unified, side slot 1")
    # What the side request under the agent's system prompt costs grows with the conversation:
    # by the last turn it is more than twice what the turn added.
    for other in (chosen, one, cleared):
        assert all(o >= k for o, k in zip(other, kept, strict=True)), (other, kept)
        assert other[-1] > 2 * kept[-1], (other, kept)

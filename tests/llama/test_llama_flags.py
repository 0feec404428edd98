"""supervisor.flags reads a command line as the real llama-server does: the last occurrence of a
flag wins, under either of its names (the fixture passes ``-c 2048 -np 2`` first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.flags import CTX_SIZE, PARALLEL, positive_int
from tests.support.llama_fixtures import LLAMA, make_models, running_llama_server

pytestmark = pytest.mark.llama


def test_slots_and_context_are_what_the_flags_read(tmp_path: Path) -> None:
    models = make_models(tmp_path / "models")
    later = ("--parallel", "3", "--ctx-size", "1536", "-c", "768")
    with running_llama_server(models[LLAMA], *later, log_dir=tmp_path / "logs") as server:
        status, props = server.get_json("/props")
    assert status == 200
    assert props["total_slots"] == positive_int(server.argv, PARALLEL) == 3
    # The context (-c / --ctx-size) is shared among the slots: 768 / 3 each.
    per_slot = props["default_generation_settings"]["n_ctx"]
    assert per_slot * props["total_slots"] == positive_int(server.argv, CTX_SIZE) == 768

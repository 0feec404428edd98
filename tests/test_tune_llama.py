"""`mtp-proxy tune` end to end on the real llama-server with the tiny qwen35 MTP model.

The model's MTP block drafts exactly what its trunk says (acceptance ~100%), so on stock
llama-server (one process per setting) the speculative settings must show drafted and accepted
tokens, off none, and the outputs must be usable as they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.routing.settings import RoutingSettings
from proxy.routing.stats import LearnedStats
from proxy.settings import Settings
from tests.llama_pool import FAST_SUPERVISOR, identity_model, llama_model
from tests.tune_helpers import by_class, profiles, results, run_tune, write_config

pytestmark = pytest.mark.llama


def test_tune_runs_end_to_end_one_process_per_setting(tmp_path: Path) -> None:
    model = llama_model(
        identity_model(tmp_path / "models"),
        profiles=[{"name": "off"}],
        args=["-c", "2048", "-np", "1", "-t", "1"],
    )
    config = write_config(tmp_path, {"supervisor": FAST_SUPERVISOR, "models": [model]})
    out = tmp_path / "out"
    done = run_tune(
        config, out, "--settings", "off,1,2/1", "--repeats", "2", "--mode", "per-process",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tune: starting") == 3  # one process per setting, one at a time
    rows = results(out)
    # The tiny model's tokenizer spends ~4x the tokens of a real one on the same text: the
    # built-in code and prose at 512 tokens exceed its 2,048-token context; tune says so per
    # request and goes on with the greeting (prose) and the game (code).
    assert "exceeds the available context size" in done.stderr
    assert {row["class"] for row in rows} == {"<4k/prose", "<4k/code"}
    for label in ("<4k/prose", "<4k/code"):
        cells = by_class(rows, label)
        assert set(cells) == {"off", "n1", "n2-m1"}
        assert cells["off"]["acceptance"] is None  # nothing drafted
        for name in ("n1", "n2-m1"):
            assert cells[name]["acceptance"] > 0.3, (label, name, cells[name])
            assert cells[name]["tok_s"] > 0 and cells[name]["repeats"] == 2
    found = profiles(out)
    assert found[0] == {"name": "off"}
    Settings(models=[{"name": "m", "backend": "simulator", "profiles": found}])
    stats = LearnedStats.load(out / "routing-state.json", RoutingSettings())
    assert stats.load_report.startswith("loaded"), stats.load_report

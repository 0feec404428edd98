"""`mtp-proxy tune` end to end on the real llama-server with the tiny qwen35 MTP model.

On stock llama-server one process per setting, on the patched build (scripts/build-llama-server.sh)
the depth per request in one process; the speculative settings must show drafted and accepted
tokens, off none, and the outputs must be usable as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings
from proxy.config.settings import Settings
from proxy.routing.stats import LearnedStats
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.llama_pool import FAST_SUPERVISOR, identity_model, llama_model
from tests.support.tune_helpers import by_class, profiles, results, run_tune, write_config

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
    # The tiny model's tokenizer spends ~4x the tokens of a real one on code: the built-in code
    # at 512 tokens is 2,216 of its tokens, over its 2,048-token context. Tune says so for each
    # of those 6 requests (3 settings x 2 repeats) and measures every other one (the server's
    # early answer must not break the next request's connection).
    failed = [line for line in done.stderr.splitlines() if line.startswith("failed: ")]
    assert len(failed) == 6, failed
    assert all("code-512" in f and "exceeds the available context size" in f for f in failed)
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


def test_tune_on_the_patched_build_varies_the_depth_in_one_process(tmp_path: Path) -> None:
    """The patched llama-server honours "speculative.n_max": the probe says so, and auto mode
    measures off, n_max 1 and n_max 2 as depths of one process started at n_max 2."""
    model = llama_model(
        identity_model(tmp_path / "models"),
        profiles=[{"name": "off"}],
        args=["-c", "2048", "-np", "1", "-t", "1"],
    )
    model["binary"] = patched_llama_server_binary()
    config = write_config(tmp_path, {"supervisor": FAST_SUPERVISOR, "models": [model]})
    out = tmp_path / "out"
    done = run_tune(config, out, "--settings", "off,1,2", "--repeats", "2", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tune: starting") == 1
    assert "per request: off, n1, n2" in done.stderr
    drafted: dict[str, list[float]] = {}
    for name in ("off", "n1", "n2"):
        for line in (out / "settings" / f"{name}.jsonl").read_text().splitlines():
            m = json.loads(line)
            assert m["mode"] == "per-request"
            drafted.setdefault(name, []).append((m["draft_n"] or 0) / m["output_tokens"])
    # Depth 0 drafts nothing in a process started at n_max 2; depth 1 at most one per token.
    assert max(drafted["off"]) == 0
    assert 0 < max(drafted["n1"]) <= 1.0
    assert sum(drafted["n2"]) > sum(drafted["n1"])

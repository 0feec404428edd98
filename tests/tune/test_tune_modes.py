"""Per process or per request: tune on a simulator that honours "speculative.n_max" per request
(as the patched llama-server) and on one that ignores it (as stock llama-server)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tune_helpers import by_class, results, run_tune, sim_config, write_config

GRID = "off,1,3,2/1"
SHORT_CHAT = "<4k/prose"


def _modes(out: Path) -> dict[str, set[str]]:
    """setting -> the modes its measurements were made in."""
    modes: dict[str, set[str]] = {}
    for path in (out / "settings").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            modes.setdefault(path.stem, set()).add(json.loads(line)["mode"])
    return modes


def test_auto_on_a_backend_that_honours_the_field_varies_the_depth_per_request(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, sim_config("setup-b", 8192))
    out = tmp_path / "out"
    done = run_tune(config, out, "--settings", GRID, "--repeats", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    # off, n1 and n3 share the process started at n_max 3; n2/n_min 1 needs its own.
    assert "per request: off, n1, n3" in done.stderr
    assert done.stderr.count("tune: starting") == 2
    assert _modes(out) == {
        "off": {"per-request"},
        "n1": {"per-request"},
        "n3": {"per-request"},
        "n2-m1": {"per-process"},
    }
    rows = results(out)
    short = by_class(rows, SHORT_CHAT)
    # The depth reached the backend: n_max 1 and 3 in one process are far apart.
    assert short["n3"]["spread"]["tok_s"]["lo"] > short["n1"]["spread"]["tok_s"]["hi"]
    assert short["off"]["acceptance"] is None  # depth 0: nothing drafted
    assert 1.5 <= short["n3"]["speedup"] <= 1.9
    # One process, one prompt after another under each depth: each still paid its prefill
    # (~6.6k tokens at ~1,000 tok/s), none was answered from the previous one's cache.
    for name, row in by_class(rows, "4k-16k/code").items():
        assert row["prefill_s"] > 5.0, (name, row)


def test_auto_on_a_backend_that_ignores_the_field_starts_a_process_per_setting(
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path, sim_config("setup-b", 2048, extra_args=("--ignore-request-draft",))
    )
    out = tmp_path / "out"
    done = run_tune(config, out, "--settings", "off,1,3", "--repeats", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tune: starting") == 3
    assert _modes(out) == {"off": {"per-process"}, "n1": {"per-process"}, "n3": {"per-process"}}
    short = by_class(results(out), SHORT_CHAT)
    assert short["n3"]["spread"]["tok_s"]["lo"] > short["n1"]["spread"]["tok_s"]["hi"]

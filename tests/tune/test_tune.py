"""`mtp-proxy tune` on the simulator: it must find the calibrated truth from its own measurements,
its outputs must be usable as they are (profiles, a learned file that warms a real proxy), and
a run must survive Ctrl-C and resume without measuring anything twice.

The simulator runs with --latent-sigma 0 and a compressed clock; what remains is the sampling
noise of each verification step, which the repeats and spreads are there for.
"""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.config.routing import RoutingSettings
from proxy.config.settings import Settings
from proxy.routing.stats import LearnedStats
from proxy.tune.plan.workload import builtin_workload
from proxy.tune.report.chart import SUMMARY, chart_name
from proxy.workloads import texts
from tests.support.harness import proxy_config, running_proxy, simulator_model, wait_all_ready
from tests.support.tune_helpers import (
    best,
    by_class,
    document,
    first_decision,
    profiles,
    results,
    run_tune,
    sim_config,
    tune_argv,
    write_config,
)

# The published Setup B runs (docs/published-figures.md#setup-b) varied n_max (n_max 3 best on short
# chat: 1.71x). n_max 2 / n_min 1 is within ~3.5 % of n_max 3 there in the model, inside one
# request's sampling noise: it is measured in the Setup A test, whose table it comes from.
SETUP_B_GRID = "off,1,2,3"
SETUP_A_GRID = "off,1,2,2/1,2/2"  # the five rows of the published Setup A table
SHORT_CHAT = "<4k/prose"  # the greeting's class
LONG_CODE = "64k+/code"


@pytest.fixture(scope="module")
def setup_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tune run on setup-b with the built-in workload (context 100k, as published)."""
    workdir = tmp_path_factory.mktemp("tune-b")
    config = write_config(workdir, sim_config("setup-b", 100_000))
    out = workdir / "out"
    # One process per setting, as the published runs were made: every setting answers the same
    # prompts, a paired comparison (per request, each setting's prompts differ: see modes).
    done = run_tune(
        config, out, "--settings", SETUP_B_GRID, "--repeats", "3", "--mode", "per-process"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (workdir / "stdout.txt").write_text(done.stdout)
    (workdir / "stderr.txt").write_text(done.stderr)
    return out


def test_setup_b_n_max_3_best_on_short_chat_off_best_on_80k_code(setup_b: Path) -> None:
    rows = results(setup_b)
    assert best(rows, SHORT_CHAT) == "n3"
    short = by_class(rows, SHORT_CHAT)
    assert 1.55 <= short["n3"]["speedup"] <= 1.85  # published 1.71x on a greeting
    assert "faster than off" in short["n3"]["verdict"]
    assert best(rows, LONG_CODE) == "off"
    # Every repeat processed its whole ~82k-token prompt (no prefix cache between repeats):
    # ~120 s at setup-b's 1,000 tok/s, slower with the context.
    assert by_class(rows, LONG_CODE)["off"]["prefill_s"] > 90
    for name, row in by_class(rows, LONG_CODE).items():
        if name != "off":
            assert row["speedup"] < 1.0, (name, row)
            assert "slower than off" in row["verdict"], (name, row)


def test_results_rows_carry_profile_fields_class_and_spread(setup_b: Path) -> None:
    rows = results(setup_b)
    assert {row["class"] for row in rows} >= {SHORT_CHAT, "<4k/code", LONG_CODE}
    settings = {json.dumps(row["setting"], sort_keys=True) for row in rows}
    assert '"off"' in settings
    n2 = {"spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": None, "draft_p_min": None}
    assert json.dumps(n2, sort_keys=True) in settings
    for row in rows:
        spread = row["spread"]["tok_s"]
        assert spread["lo"] <= row["tok_s"] <= spread["hi"]
        assert row["repeats"] == 3
        if row["setting"] != "off":
            assert 0.0 < row["acceptance"] < 1.0
    with (setup_b / "results.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert {r["setting"] for r in table} == {"off", "n1", "n2", "n3"}


def test_printed_table_and_a_chart_per_class(setup_b: Path) -> None:
    stdout = (setup_b.parent / "stdout.txt").read_text()
    assert "speedup" in stdout and SHORT_CHAT in stdout
    classes = {row["class"] for row in results(setup_b)}
    charts = sorted(setup_b.glob("chart-*.png"))
    # One per class, its name keeping the class (64k+ is not 64k), and the summary.
    assert {p.name for p in charts} == {chart_name(c) for c in classes} | {SUMMARY}
    assert "chart-64k+-code.png" in {p.name for p in charts}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in charts)


def test_recommended_profiles_are_off_and_n_max_3_and_validate(setup_b: Path) -> None:
    found = profiles(setup_b)
    assert [p["name"] for p in found] == ["off", "n3"]
    assert found[1] == {"name": "n3", "spec_type": "draft-mtp", "draft_n_max": 3}
    text = (setup_b / "profiles.toml").read_text()
    assert "# code, 64k+ tokens: no setting beats off" in text
    assert '# [routing] profile_off = "off", profile_max = "n3"' in text
    # The block is a valid [[models.profiles]] list as it stands.
    Settings(models=[{"name": "m", "backend": "simulator", "profiles": found}])


def test_state_file_loads_every_cell_trusted(setup_b: Path) -> None:
    stats = LearnedStats.load(setup_b / "routing-state.json", RoutingSettings())
    assert stats.load_report.startswith("loaded")
    rows = stats.table()
    assert {r["profile"] for r in rows} == {"off", "n3"}
    assert all(r["trusted"] for r in rows)
    # The chars-per-token ratio the classes were computed with travels along.
    assert stats.calibrator.chars_per_token("mtp-demo") != RoutingSettings().chars_per_token
    short = {r["profile"]: r for r in rows if r["class"] == SHORT_CHAT}
    assert short["n3"]["decode_tok_s"] > 1.5 * short["off"]["decode_tok_s"]


PROSE_COLLAPSE = ("--acceptance-scale", "prose=0.1")  # a drafter that fails on prose


@pytest.fixture(scope="module")
def prose_collapse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune run where the cold rules are wrong: drafting collapses on prose, so off is best
    for a short chat, which the cold rules send to max."""
    workdir = tmp_path_factory.mktemp("tune-collapse")
    config = write_config(workdir, sim_config("setup-b", 8192, extra_args=PROSE_COLLAPSE))
    out = workdir / "out"
    # Per process: the proxy below serves the profiles as a pool of processes, so off is a
    # process without the MTP head (per request, off is depth 0 of an MTP process).
    done = run_tune(config, out, "--settings", "off,3", "--repeats", "2", "--mode", "per-process")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("shape", ["per-process", "per-request"])
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_seeded_state_changes_the_first_decision(
    prose_collapse: Path, tmp_path: Path, warm: bool, shape: str
) -> None:
    """On a pool and on one process serving the profiles as per-request depths: tune measured
    each request alone, which is the pool's cell and the one process's "alone" load level."""
    found = profiles(prose_collapse)
    assert [p["name"] for p in found] == ["off", "n3"]  # n_max 3 still wins on code
    state = tmp_path / "state.json"
    if warm:
        shutil.copy(prose_collapse / "routing-state.json", state)
    model = simulator_model(
        preset="setup-b",
        time_scale=200.0,
        slots=1,
        profiles=found,
        extra_args=[*PROSE_COLLAPSE],
        draft_control=shape,
    )
    routing = {
        "learned_file": str(state),
        "exploration_rate": 0.0,
        "cold_exploration_rate": 0.0,
        "seed": 1,
        "clock_scale": 200.0,
        **document(prose_collapse)["roles"],  # n3 plays max, as --apply writes it
    }
    with running_proxy(proxy_config([model], routing=routing), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {"mtp-demo": 2 if shape == "per-process" else 1})
        profile, reason = first_decision(proxy.url)
    if warm:
        assert (profile, reason.split(" ")[0]) == ("off", "learned"), reason
    else:  # the cold rule: a short chat goes to max, which n3 plays
        assert (profile, reason.split(" ")[0]) == ("n3", "rule"), reason


def test_setup_a_n_max_2_n_min_1_best_and_n_max_1_below_off_at_65k_code(tmp_path: Path) -> None:
    """The published Setup A table (docs/published-figures.md#setup-a): code at a 65,536-token
    context, 512 tokens out."""
    rng = random.Random(3)
    trace = tmp_path / "long-code.jsonl"
    with trace.open("w") as f:
        for _n in range(2):
            code = texts.code_file(rng, int(66_500 * 3.3))
            body = {
                "model": "x",
                "messages": [{"role": "user", "content": f"```python\n{code}```\nFix the bug."}],
                "max_tokens": 512,
                "ignore_eos": True,
            }
            record = {"at": 0.0, "session": None, "path": "/v1/chat/completions", "body": body}
            f.write(json.dumps(record) + "\n")
    config = write_config(tmp_path, sim_config("setup-a", 90_000))
    out = tmp_path / "out"
    done = run_tune(
        config, out, "--workload", str(trace), "--settings", SETUP_A_GRID, "--repeats", "3",
        "--mode", "per-process",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = results(out)
    assert {row["class"] for row in rows} == {LONG_CODE}
    cells = by_class(rows, LONG_CODE)
    assert best(rows, LONG_CODE) == "n2-m1"
    assert "faster than off" in cells["n2-m1"]["verdict"]
    assert cells["n1"]["tok_s"] < cells["off"]["tok_s"]
    assert [p["name"] for p in profiles(out)] == ["off", "n2-m1"]
    assert profiles(out)[1]["draft_n_min"] == 1


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _lines(out: Path) -> dict[str, int]:
    return {p.stem: len(p.read_text().splitlines()) for p in (out / "settings").glob("*.jsonl")}


def test_ctrl_c_twice_keeps_results_and_a_rerun_measures_only_the_rest(tmp_path: Path) -> None:
    # A slower clock: the run takes long enough to be interrupted in its second setting.
    config = write_config(tmp_path, sim_config("setup-b", 8192, time_scale=50.0))
    out = tmp_path / "out"
    args = ("--settings", "off,2,3", "--repeats", "2", "--mode", "per-process")
    process = subprocess.Popen(
        tune_argv(config, out, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    buckets = RoutingSettings().context_buckets
    per_setting = 2 * len(builtin_workload(8192, buckets, "mtp-demo").items)  # x 2 repeats
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "settings" / "n2.jsonl").exists():
        time.sleep(0.05)
    children = _children(process.pid)
    assert children, "no backend process while measuring"
    process.send_signal(signal.SIGINT)
    time.sleep(0.1)
    process.send_signal(signal.SIGINT)  # an impatient second Ctrl-C changes nothing
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    assert "estimated time: ~" in stderr and "left ~" in stderr
    kept = _lines(out)
    assert kept["off"] == per_setting
    assert 1 <= kept["n2"] < per_setting
    assert {row["setting_name"] for row in results(out)} >= {"off", "n2"}
    assert "off" in stdout  # the table was printed from what was measured
    for pid in children:  # the backend was stopped, not left behind
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid

    again = run_tune(config, out, *args)
    assert again.returncode == 0, again.stderr[-2000:]
    measured_before = sum(kept.values())
    assert f"; {3 * per_setting - measured_before} to measure" in again.stderr
    assert _lines(out) == {"off": per_setting, "n2": per_setting, "n3": per_setting}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.fixture
def no_matplotlib(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose `import matplotlib` finds nothing (a stub package that fails)."""
    shadow = tmp_path / "shadow"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden for the test')")
    yield {**os.environ, "PYTHONPATH": str(shadow)}


def test_without_matplotlib_the_table_alone_said_once(
    tmp_path: Path, no_matplotlib: dict[str, str]
) -> None:
    config = write_config(tmp_path, sim_config("setup-b", 2048))
    out = tmp_path / "out"
    done = subprocess.run(
        tune_argv(config, out, "--settings", "off,3", "--repeats", "1"),
        capture_output=True, text=True, timeout=120, env=no_matplotlib,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("matplotlib is not installed") == 1
    # The one command that adds them to this environment (serve.sh's has no plot extra).
    assert f"add them with `{sys.executable} -m pip install 'matplotlib>=3.8'`" in done.stdout
    assert not list(out.glob("*.png"))
    assert (out / "results.csv").exists() and (out / "profiles.toml").exists()
    # One repeat: no spread, so nothing is declared better than off, and the file says why.
    assert [p["name"] for p in profiles(out)] == ["off"]
    assert "one repeat" in (out / "profiles.toml").read_text()

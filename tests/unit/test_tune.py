"""`mtp-proxy tune` refuses bad input with a clear error before it starts anything (tune on
simulated backends: tests/tune/test_tune.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.cli.main import main as cli_main
from proxy.tune.measure.store import ResultStore, StoreError
from tests.support.tune_helpers import sim_config, write_config


def _tune_in_process(
    capsys: pytest.CaptureFixture[str], config: Path, out: Path, *args: str
) -> tuple[int, str]:
    """The command's own entry point (these cases stop before any process is started)."""
    code = cli_main(["tune", "--config", str(config), "--out", str(out), *args])
    return code, capsys.readouterr().err


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, sim_config("setup-b", 8192))
    out = tmp_path / "out"
    bad_trace = tmp_path / "bad.jsonl"
    bad_trace.write_text('{"at": 0, "path": "/v1/nope", "body": {}}\n')
    cases = [
        (("--settings", "off,5/7"), "n_min must not exceed n_max"),
        (("--settings", "fast"), "expected off or N[/M][@P]"),
        (("--model", "nope"), "no model 'nope'"),
        (("--workload", str(tmp_path / "missing.jsonl")), "cannot read"),
        (("--workload", str(bad_trace)), "line 1: 'path' must be one of"),
        (("--repeats", "0"), "--repeats must be at least 1"),
    ]
    for args, message in cases:
        code, err = _tune_in_process(capsys, config, out, *args)
        assert code == 2, (args, err)
        assert message in err, (args, err)
    code, err = _tune_in_process(capsys, tmp_path / "missing.toml", out)
    assert code == 2 and "file not found" in err, err


def test_results_of_another_model_are_not_mixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any process starts: another model's results are in OUT."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"model": "other", "workload": "0123"}))
    config = write_config(tmp_path, sim_config("setup-b", 8192))
    code, err = _tune_in_process(capsys, config, out, "--settings", "off")
    assert code == 2
    assert "holds results of another model" in err


def test_results_of_another_workload_or_way_of_measuring_are_not_mixed(tmp_path: Path) -> None:
    """The workload is known once the server's context is (so the check is the store's)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"model": "m", "workload": "0123", "via": "service"}))
    store = ResultStore(out)
    with pytest.raises(StoreError, match="another workload"):
        store.open({"model": "m", "workload": "4567", "via": "service"})
    with pytest.raises(StoreError, match="another via"):
        store.check({"model": "m", "via": "processes"})
    store.open({"model": "m", "workload": "0123", "via": "service"})  # the same run: resumed

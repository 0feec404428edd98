"""Hostile local files given to `mtp-proxy check-config`, `serve` and `tune`: a FIFO, a device
(/dev/zero), a file far too large, nesting deeper than a parser goes. Each is refused at once
with a message naming the problem, exit status 2, never a hang, a traceback or memory eaten
(before: a FIFO blocked for ever, /dev/zero was read until memory ran out, deep nesting gave a
RecursionError's traceback). The commands run in their own processes under a 2 GiB address
space limit, so a regression fails here instead of taking the machine's memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomli_w

from tests.support.cli import ROOT
from tests.support.harness import proxy_config, simulator_model

MEMORY_LIMIT = 2 << 30
SECONDS = 60  # a bound, not a measurement: each answer takes about a second


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def mtp_proxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SECONDS,
        preexec_fn=limited,
    )


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def devzero(_tmp_path: Path) -> Path:
    return Path("/dev/zero")


def too_large(tmp_path: Path) -> Path:
    path = tmp_path / "large.toml"
    path.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    return path


def deep_toml(tmp_path: Path) -> Path:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    return path


CONFIGS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (fifo, "is a FIFO, not a regular file"),
    "device": (devzero, "is a device, not a regular file"),
    "too large": (too_large, "is larger than 1048576 bytes"),
    "deep nesting": (deep_toml, "nested too deeply"),
}


def refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("case", sorted(CONFIGS))
@pytest.mark.parametrize("command", ["check-config", "serve", "tune"])
def test_a_hostile_config_is_refused(tmp_path: Path, case: str, command: str) -> None:
    make, message = CONFIGS[case]
    path = make(tmp_path)
    args = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    refused(mtp_proxy(*args), message)


def good_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(proxy_config([simulator_model(draft_control="per-request")])))
    return path


def deep_trace(tmp_path: Path) -> Path:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"at": 0, "body": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    return path


WORKLOADS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (fifo, "is a FIFO, not a regular file"),
    "device": (devzero, "is a device, not a regular file"),
    "deep nesting": (deep_trace, "line 1: nested too deeply to read"),
}


@pytest.mark.parametrize("case", sorted(WORKLOADS))
def test_a_hostile_workload_is_refused_by_tune(tmp_path: Path, case: str) -> None:
    make, message = WORKLOADS[case]
    args = ["tune", "--config", str(good_config(tmp_path)), "--workload", str(make(tmp_path))]
    refused(mtp_proxy(*args, "--out", str(tmp_path / "out")), message)


@pytest.mark.parametrize("name", ["run.json", "settings/off.jsonl"])
def test_a_fifo_among_tunes_results_is_refused(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    (out / "settings").mkdir(parents=True)
    os.mkfifo(out / name)
    args = ["tune", "--config", str(good_config(tmp_path)), "--out", str(out)]
    refused(mtp_proxy(*args), "is a FIFO, not a regular file")

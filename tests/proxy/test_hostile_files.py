"""Hostile local files given to `mtp-proxy check-config`, `serve`, `init` and `tune`: a FIFO, a
device (/dev/zero), a file far too large, nesting deeper than a parser goes, a GGUF whose counts
claim more than the file holds or that ends early. Each is refused at once
with a message naming the problem, exit status 2, never a hang, a traceback or memory eaten
(before: a FIFO blocked for ever, /dev/zero was read until memory ran out, deep nesting gave a
RecursionError's traceback). The commands run in their own processes under a 2 GiB address
space limit, so a regression fails here instead of taking the machine's memory."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomli_w

from tests.support.cli import ROOT
from tests.support.harness import proxy_config, simulator_model
from tests.support.tinygguf import LlamaConfig, write_llama

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


# --- model files: GGUFs that lie about their counts, or end early -------------------------------

GGUF_SECONDS = 20  # a bound that proves no hang (each answers in about a second), not a timing


def gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def gguf_head(entries: int, tensors: int = 0) -> bytes:
    """A GGUF v3 header, then general.architecture = "qwen35" (the first of `entries`)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, tensors, entries)
    return head + gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("qwen35")


def string_array_claiming_2_62(tmp_path: Path) -> Path:
    """170 bytes whose vocabulary claims 2^62 strings: hung init, check-config and serve."""
    array = struct.pack("<IIQ", 9, 8, 1 << 62)  # an array of strings, 2^62 of them
    data = gguf_head(2) + gguf_string("tokenizer.ggml.tokens") + array + gguf_string("a") * 2
    path = tmp_path / "strings.gguf"
    path.write_bytes(data.ljust(170, b"\0"))
    return path


def number_array_claiming_2_61(tmp_path: Path) -> Path:
    """200 bytes claiming 2^61 uint32 values: accepted before."""
    array = struct.pack("<IIQ", 9, 4, 1 << 61)  # an array of uint32, 2^61 of them
    data = gguf_head(2) + gguf_string("tokenizer.ggml.token_type") + array
    path = tmp_path / "numbers.gguf"
    path.write_bytes(data.ljust(200, b"\1"))
    return path


def entries_claiming_2_60(tmp_path: Path) -> Path:
    path = tmp_path / "entries.gguf"
    path.write_bytes(gguf_head(1 << 60).ljust(256, b"\0"))
    return path


def tiny_model(tmp_path: Path) -> bytes:
    return write_llama(tmp_path / "whole.gguf", LlamaConfig()).read_bytes()


def cut_in_its_metadata(tmp_path: Path) -> Path:
    """A download that stopped in the metadata: numpy's "index 0 is out of bounds" before."""
    whole = tiny_model(tmp_path)
    path = tmp_path / "cut-metadata.gguf"
    path.write_bytes(whole[: len(whole) // 200])
    return path


def cut_in_its_tensors(tmp_path: Path) -> Path:
    """A download that stopped in the tensor data, the bulk of any real file."""
    whole = tiny_model(tmp_path)
    path = tmp_path / "cut-tensors.gguf"
    path.write_bytes(whole[: len(whole) - 4096])
    return path


NOT_GGUF = "is not a GGUF file ("
TRUNCATED = "truncated GGUF (download incomplete?)"
GGUFS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "strings 2^62": (string_array_claiming_2_62, NOT_GGUF + "4611686018427387904 strings in "),
    "uint32s 2^61": (
        number_array_claiming_2_61,
        NOT_GGUF + "the array tokenizer.ggml.token_type of 9223372036854775808 bytes claimed",
    ),
    "entries 2^60": (entries_claiming_2_60, NOT_GGUF + "1152921504606846976 metadata entries"),
    "cut in its metadata": (cut_in_its_metadata, TRUNCATED),
    "cut in its tensors": (cut_in_its_tensors, TRUNCATED),
}


def gguf_command(command: str, model: Path, tmp_path: Path) -> list[str]:
    if command == "init":
        return ["init", str(model), "--out", str(tmp_path / "init.toml")]
    llama = {"name": "m", "binary": "/bin/true", "model_path": str(model)}
    config = {"server": {"port": 0}, "models": [{**llama, "profiles": [{"name": "off"}]}]}
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return (
        ["check-config", str(path)]
        if command == "check-config"
        else [command, "--config", str(path)]
    )


@pytest.mark.parametrize("case", sorted(GGUFS))
@pytest.mark.parametrize("command", ["init", "check-config", "serve"])
def test_a_hostile_or_truncated_gguf_is_refused_at_once(
    tmp_path: Path, case: str, command: str
) -> None:
    make, message = GGUFS[case]
    model = make(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", *gguf_command(command, model, tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GGUF_SECONDS,
        preexec_fn=limited,
    )
    refused(done, message)
    assert str(model) in done.stderr
    assert not (tmp_path / "init.toml").exists()


@pytest.mark.parametrize("case", sorted(GGUFS))
@pytest.mark.parametrize("command", ["init", "check-config"])
def test_a_hostile_or_truncated_draft_model_is_refused_at_once(
    tmp_path: Path, case: str, command: str
) -> None:
    # A draft model's vocabulary is read whole (its tokens compared with the model's): the
    # same bounds hold for the arrays kept as for those stepped over.
    make, message = GGUFS[case]
    draft = make(tmp_path)
    target = write_llama(tmp_path / "target.gguf", LlamaConfig())
    if command == "init":
        argv = ["init", str(target), "--draft-model", str(draft), "--out", str(tmp_path / "i.toml")]
    else:
        llama = {"name": "m", "binary": "/bin/true", "model_path": str(target)}
        profile = {"name": "d", "spec_type": "draft-simple", "draft_model": str(draft)}
        path = tmp_path / "config.toml"
        path.write_text(tomli_w.dumps({"models": [{**llama, "profiles": [profile]}]}))
        argv = ["check-config", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GGUF_SECONDS,
        preexec_fn=limited,
    )
    refused(done, message)
    assert str(draft) in done.stderr
    assert not (tmp_path / "i.toml").exists()

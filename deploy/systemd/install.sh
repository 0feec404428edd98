#!/usr/bin/env bash
# Install (or upgrade) mtp-proxy as a systemd service. Idempotent: run it again after a
# `git pull` to upgrade; an existing /etc/mtp-proxy/config.toml is never overwritten.
#
#   sudo deploy/systemd/install.sh [OPTIONS] [REPO_PATH]      (--help: the options)
#
# Layout: system user mtp-proxy, virtualenv /opt/mtp-proxy/venv (with the plot extra, for
# `tune`'s charts), the patched llama-server in /opt/mtp-proxy/llama-server (--with-llama-server),
# config /etc/mtp-proxy/config.toml (root:mtp-proxy 0640: it may hold API keys), learned
# statistics in /var/lib/mtp-proxy (StateDirectory=), unit /etc/systemd/system/mtp-proxy.service.
# Everything is checked before anything is touched; --dry-run prints every step and does none.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: sudo deploy/systemd/install.sh [OPTIONS] [REPO_PATH]

Installs or upgrades mtp-proxy as a systemd service from a checkout (REPO_PATH, default: the
checkout this script is in): the mtp-proxy user, the virtualenv /opt/mtp-proxy/venv, the config
/etc/mtp-proxy/config.toml (the example, on first install only), the unit, then (re)starts it.

options:
  --with-llama-server[=BINARY]  put the patched llama-server in /opt/mtp-proxy/llama-server,
                                where the service can read it: built (or taken from the build
                                cache) by scripts/build-llama-server.sh, honouring CMAKE_ARGS
                                (CMAKE_ARGS="-DGGML_CUDA=ON" for a GPU); or BINARY copied with
                                the shared libraries beside it
  --prometheus[=CONFIG]         add the mtp-proxy scrape job and alert rules to a local
                                Prometheus (CONFIG, default /etc/prometheus/prometheus.yml)
  --dry-run                     print every step, do nothing
  -h, --help                    this text

environment: PYTHON (the interpreter of the virtualenv, 3.11 or newer, not under a home
directory; default python3), CMAKE_ARGS (for --with-llama-server).
EOF
}

say() { echo "install.sh: $*"; }
die() { echo "install.sh: $*" >&2; exit 1; }

given=("$@")
dry_run=""
llama=""          # "", "build" or the path of a binary to copy
prometheus=""     # "" or the Prometheus config to add the job to
repo_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1 ;;
    --with-llama-server) llama=build ;;
    --with-llama-server=*) llama=${1#*=} ;;
    --prometheus) prometheus=/etc/prometheus/prometheus.yml ;;
    --prometheus=*) prometheus=${1#*=} ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) [ -z "$repo_arg" ] || { usage >&2; die "one REPO_PATH only"; }; repo_arg=$1 ;;
  esac
  shift
done

# Every step goes through run: printed, and done unless --dry-run (run_quiet: its output is
# dropped, its failure is not).
run() {
  echo "+ $*"
  if [ -z "$dry_run" ]; then "$@"; fi
}
run_quiet() {
  echo "+ $* >/dev/null"
  if [ -z "$dry_run" ]; then "$@" >/dev/null; fi
}
# Whether a unit runs now: a question, not a step; quiet where no systemd answers (a dry run on
# a container or a build box), where it counts as not running.
running() {
  systemctl is-active --quiet "$1" 2>/dev/null
}

python=${PYTHON:-python3}
prefix=/opt/mtp-proxy
venv=$prefix/venv
llama_dir=$prefix/llama-server
etc=/etc/mtp-proxy
unit=/etc/systemd/system/mtp-proxy.service
user=mtp-proxy
umask 022  # the venv and unit must be readable by the service user

# --- 0. Checks: nothing is touched before all of them pass -----------------------------------
[ -n "$dry_run" ] || [ "$(id -u)" -eq 0 ] || die "run as root (sudo), or preview with --dry-run"
repo=$(cd "${repo_arg:-$(dirname "$0")/../..}" && pwd)
[ -f "$repo/pyproject.toml" ] && [ -f "$repo/deploy/systemd/mtp-proxy.service" ] ||
  die "$repo is not an mtp-proxy checkout"
command -v "$python" >/dev/null || die "no $python: install python3 (3.11 or newer) or set PYTHON"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  die "$python is older than 3.11 (set PYTHON=...)"
# The venv links to its interpreter: under a home directory (pyenv, conda, a user's build) the
# service user cannot reach it, and the unit's ProtectHome=yes hides it anyway. Each of its names
# counts: the path the venv will link to, the file it resolves to, its installation.
where=$("$python" -c 'import os, sys
base = getattr(sys, "_base_executable", sys.executable)
for path in (sys.executable, base, os.path.realpath(base), os.path.realpath(sys.base_prefix)):
    print(os.path.abspath(path))')
while read -r path; do
  case "$path/" in
    /home/*|/root/*|/run/user/*)
      die "$python is $path, under a home directory: the service user could not run the" \
        "virtualenv made from it. Use the system's interpreter:" \
        "sudo PYTHON=/usr/bin/python3 $0 ${given[*]}" ;;
  esac
done <<<"$where"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
  die "$python cannot make a virtualenv (Debian/Ubuntu: apt-get install python3-venv)"
if [ -n "$llama" ] && [ "$llama" != build ]; then
  [ -x "$llama" ] && [ -f "$llama" ] || die "--with-llama-server=$llama is not an executable file"
fi
if [ -n "$prometheus" ]; then
  [ -f "$prometheus" ] || die "--prometheus: no $prometheus (is Prometheus installed?)"
fi
[ -z "$dry_run" ] || say "dry run: printing the steps, doing nothing"

# --- 1. A static system user (not DynamicUser=): model files can be made readable to it -----
if ! getent passwd "$user" >/dev/null; then
  run useradd --system --user-group --home-dir /var/lib/mtp-proxy --no-create-home \
    --shell /usr/sbin/nologin --comment "mtp-proxy service" "$user"
fi
# GPU device nodes owned by these groups (AMD's /dev/kfd and /dev/dri, some NVIDIA set-ups).
for group in video render; do
  if getent group "$group" >/dev/null; then run usermod --append --groups "$group" "$user"; fi
done

# --- 2. The virtualenv, with the project and its plot extra installed from the checkout (not
#        editable: the service must not depend on the checkout staying where it is) ----------
run install -d -m 0755 "$prefix"
[ -x "$venv/bin/python" ] || run "$python" -m venv "$venv"
run "$venv/bin/python" -m pip install --quiet --upgrade pip
run "$venv/bin/python" -m pip install --quiet --upgrade "$repo[plot]"
run install -m 0644 "$repo/deploy/README.md" "$prefix/README.md"

# --- 3. The patched llama-server where the service can read it (not root's build cache, which
#        ProtectHome=yes hides): the build's directory, binary beside its build-info and patch --
if [ -n "$llama" ]; then
  if [ "$llama" = build ]; then
    say "building the patched llama-server (CMAKE_ARGS: ${CMAKE_ARGS:-none}; a cache hit takes seconds)"
    if [ -n "$dry_run" ]; then
      echo "+ PYTHON=$venv/bin/python bash $repo/scripts/build-llama-server.sh"
      built=/path/printed/by/build-llama-server.sh/bin/llama-server
    else
      built=$(PYTHON="$venv/bin/python" bash "$repo/scripts/build-llama-server.sh" | tail -n 1)
    fi
  else
    built=$llama
  fi
  from=$(dirname "$built")
  staging=$llama_dir.new
  run rm -rf "$staging"
  run install -d -m 0755 "$staging/bin"
  # The binary and the shared libraries a dynamic build keeps beside it.
  run find "$from" -maxdepth 1 \( -name llama-server -o -name '*.so*' \) \
    -exec cp -a -t "$staging/bin" {} +
  # The build script's cache entry says what it is: init reads it (patched, CUDA or not).
  if [ -f "$from/../build-info.txt" ] || [ -n "$dry_run" ]; then
    run find "$from/.." -maxdepth 1 \( -name build-info.txt -o -name '*.patch' \) \
      -exec cp -t "$staging" {} +
  fi
  run rm -rf "$llama_dir.old"
  if [ -e "$llama_dir" ]; then run mv -T "$llama_dir" "$llama_dir.old"; fi
  run mv -T "$staging" "$llama_dir"
  run rm -rf "$llama_dir.old"
  say "llama-server: $llama_dir/bin/llama-server (mtp-proxy init finds it there)"
fi

# --- 4. Configuration: the documented example on first install only --------------------------
run install -d -m 0750 -o root -g "$user" "$etc"
if [ ! -e "$etc/config.toml" ]; then
  run install -m 0640 -o root -g "$user" "$repo/config.toml" "$etc/config.toml"
  say "$([ -n "$dry_run" ] && echo "would write" || echo wrote) $etc/config.toml from the example (the simulated demo): for your model run"
  say "  sudo $venv/bin/mtp-proxy init /srv/models/MODEL.gguf --out $etc/config.toml --force"
fi
# Refuse to (re)start on a config the service user cannot load.
run_quiet runuser -u "$user" -- "$venv/bin/mtp-proxy" check-config --config "$etc/config.toml"

# --- 5. Prometheus: the scrape job and the alert rules, added once ----------------------------
if [ -n "$prometheus" ]; then
  rules=$(dirname "$prometheus")/mtp-proxy-alerts.yml
  run install -m 0644 "$repo/deploy/prometheus/alerts.yml" "$rules"
  run "$venv/bin/python" "$repo/deploy/prometheus/add_to_prometheus.py" "$prometheus" "$rules" \
    "$repo/deploy/prometheus/prometheus.yml"
  if command -v promtool >/dev/null; then run_quiet promtool check config "$prometheus"; fi
  if running prometheus.service; then
    run systemctl reload prometheus.service
  else
    say "Prometheus is not running: it loads the job when it starts"
  fi
fi

# --- 6. The unit: installed, enabled, and (re)started so an upgrade takes effect -------------
run install -m 0644 "$repo/deploy/systemd/mtp-proxy.service" "$unit"
run systemctl daemon-reload
if running mtp-proxy.service; then
  run systemctl enable mtp-proxy.service
  run systemctl restart mtp-proxy.service
else
  run systemctl enable --now mtp-proxy.service
fi
if [ -z "$dry_run" ]; then systemctl --no-pager --lines=0 status mtp-proxy.service || true; fi

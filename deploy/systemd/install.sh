#!/usr/bin/env bash
# Install (or upgrade) mtp-proxy as a systemd service. Idempotent: run it again after a
# `git pull` to upgrade; an existing /etc/mtp-proxy/config.toml is never overwritten.
#
#   sudo deploy/systemd/install.sh /path/to/mtp-proxy-checkout
#
# Layout: system user mtp-proxy, virtualenv /opt/mtp-proxy/venv, config
# /etc/mtp-proxy/config.toml (root:mtp-proxy 0640: it may hold API keys), learned statistics
# in /var/lib/mtp-proxy (StateDirectory=), unit /etc/systemd/system/mtp-proxy.service.
# PYTHON=python3.12 picks the interpreter for the virtualenv (3.11 or newer).
set -euo pipefail

usage() { echo "usage: $0 REPO_PATH" >&2; exit 2; }
[ $# -eq 1 ] || usage
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root (sudo)" >&2; exit 1; }
repo=$(cd "$1" && pwd)
[ -f "$repo/pyproject.toml" ] && [ -f "$repo/deploy/systemd/mtp-proxy.service" ] || {
  echo "install.sh: $repo is not an mtp-proxy checkout" >&2; exit 1; }

python=${PYTHON:-python3}
prefix=/opt/mtp-proxy
venv=$prefix/venv
etc=/etc/mtp-proxy
unit=/etc/systemd/system/mtp-proxy.service
user=mtp-proxy
umask 022  # the venv and unit must be readable by the service user

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "install.sh: $python is older than 3.11 (set PYTHON=...)" >&2; exit 1; }

# 1. A static system user (not DynamicUser=): model files on disk can be made readable to it.
if ! getent passwd "$user" >/dev/null; then
  useradd --system --user-group --home-dir /var/lib/mtp-proxy --no-create-home \
    --shell /usr/sbin/nologin --comment "mtp-proxy service" "$user"
fi
# GPU device nodes owned by these groups (AMD's /dev/kfd and /dev/dri, some NVIDIA set-ups).
for group in video render; do
  if getent group "$group" >/dev/null; then usermod --append --groups "$group" "$user"; fi
done

# 2. The virtualenv, with the project installed from the checkout (not editable: the service
#    must not depend on the checkout staying where it is).
install -d -m 0755 "$prefix"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --upgrade "$repo"
install -m 0644 "$repo/deploy/README.md" "$prefix/README.md"

# 3. Configuration: the documented example on first install only.
install -d -m 0750 -o root -g "$user" "$etc"
if [ ! -e "$etc/config.toml" ]; then
  install -m 0640 -o root -g "$user" "$repo/config.toml" "$etc/config.toml"
  echo "install.sh: wrote $etc/config.toml from the example; edit it, then: systemctl restart mtp-proxy"
fi
# Refuse to (re)start on a config the service user cannot load.
(cd / && runuser -u "$user" -- "$venv/bin/mtp-proxy" check-config "$etc/config.toml" >/dev/null)

# 4. The unit: installed, enabled, and (re)started so an upgrade takes effect.
install -m 0644 "$repo/deploy/systemd/mtp-proxy.service" "$unit"
systemctl daemon-reload
if systemctl is-active --quiet mtp-proxy.service; then
  systemctl enable mtp-proxy.service
  systemctl restart mtp-proxy.service
else
  systemctl enable --now mtp-proxy.service
fi
systemctl --no-pager --lines=0 status mtp-proxy.service || true

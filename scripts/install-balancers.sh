#!/usr/bin/env bash
# The balancers the tests/boxes tests put in front of two proxies: LiteLLM's proxy server (PyPI,
# pinned, in a venv of its own under .balancers/litellm: its many pinned dependencies must not
# meet the project's) and nginx (Debian's package, for `hash ... consistent` session affinity).
# Seconds once installed; prints nothing when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."
LITELLM_VERSION=1.106.12
venv=.balancers/litellm
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$LITELLM_VERSION')" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
fi
if ! command -v nginx >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # The package would start a system nginx on port 80: the tests run their own, so
    # policy-rc.d forbids starting services for the length of the install (Debian's way).
    blocker=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      blocker=/usr/sbin/policy-rc.d
      printf '#!/bin/sh\nexit 101\n' >"$blocker" && chmod +x "$blocker"
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null \
      || status=$?
    [ -z "$blocker" ] || rm -f "$blocker"
    [ "${status:-0}" = 0 ] || exit "$status"
  else
    echo "install-balancers: need nginx (apt-get as root); the tests/boxes tests will fail" >&2
  fi
fi

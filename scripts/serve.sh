#!/usr/bin/env bash
# Fresh machine with only python3 -> the proxy running on its embedded default (one simulated
# llama-server serving off/min/max as per-request depths) at http://127.0.0.1:8080.
# Extra arguments go to `mtp-proxy serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/mtp-proxy serve "$@"

#!/usr/bin/env bash
# The fast lane: the pure unit tests of tests/unit (no socket, no process: its conftest.py fails
# any test that opens one), in seconds. Needs only the venv, not the llama-server builds; the
# whole suite is scripts/test.sh. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import proxy, pytest, hypothesis" 2>/dev/null; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,dev]'
fi
exec .venv/bin/python -m pytest tests/unit "$@"

#!/usr/bin/env bash
# System tools some tests drive: prometheus (a live scrape of a running proxy, every dashboard
# query and alert rule evaluated), promtool (rules/config/metrics checks), both from Debian's
# `prometheus` package, systemd-analyze (unit verification), and chromium with chromedriver (the
# live page in a real browser, tests/ui). Installed from Debian's packages when missing and root.
set -euo pipefail
missing=()
{ command -v promtool && command -v prometheus; } >/dev/null || missing+=(prometheus)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "install-tools: need ${missing[*]} (apt-get as root); the tests that use them will fail" >&2
  fi
fi

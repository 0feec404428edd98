"""deploy/'s files and what the tests read from them: alert rules and systemd unit keys."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

# PyYAML arrives with the test extras (through gguf); imported this way because it ships no
# type stubs, and the tests only walk plain dicts and lists.
yaml: Any = importlib.import_module("yaml")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "mtp-proxy.json"
UNIT = DEPLOY / "systemd" / "mtp-proxy.service"
INSTALL = DEPLOY / "systemd" / "install.sh"


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def unit_values(key: str) -> list[str]:
    pattern = re.compile(rf"^{re.escape(key)}=(.*)$", re.MULTILINE)
    return [m.group(1).strip() for m in pattern.finditer(UNIT.read_text())]


def unit_value(key: str) -> str:
    values = unit_values(key)
    assert len(values) == 1, f"{key}= set {len(values)} times"
    return values[0]

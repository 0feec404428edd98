"""deploy/ checked with the real tools: promtool on the Prometheus config, the alert rules and
their unit tests, systemd-analyze on the unit, bash on its installer (the files read as data:
tests/unit/test_deploy.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.deploy_files import (
    INSTALL,
    PROMETHEUS,
    REPO,
    UNIT,
    alert_rules,
    unit_value,
    yaml,
)

MAX_EXPOSURE = 1.5  # systemd-analyze security: 0 (locked down) .. 10; the docs say 1.5 ("OK")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/install-tools.sh (as root) first")
    return path


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_prometheus_config_is_valid_and_loads_the_rules() -> None:
    result = run(tool("promtool"), "check", "config", str(PROMETHEUS / "prometheus.yml"))
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8080"]


def test_rules_pass_promtool_check() -> None:
    result = run(tool("promtool"), "check", "rules", str(PROMETHEUS / "alerts.yml"))
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_rule_unit_tests_pass() -> None:
    result = run(tool("promtool"), "test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def verify_root(tmp_path: Path) -> tuple[Path, Path]:
    """A root directory holding the unit byte for byte, an executable at its ExecStart path, the
    ExecReload command and the host's stock units (the targets it orders itself against)."""
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    shutil.copy2(UNIT, units / UNIT.name)
    candidates = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))
    stock = next(d for d in candidates if d.is_dir())
    shutil.copytree(stock, root / "usr" / "lib" / "systemd" / "system", symlinks=True)
    reload_command = root / unit_value("ExecReload").split()[0].lstrip("/")
    reload_command.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(unit_value("ExecReload").split()[0], reload_command)
    binary = root / unit_value("ExecStart").split()[0].lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return root, binary


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    root, binary = verify_root(tmp_path)
    argv = (tool("systemd-analyze"), "verify", f"--root={root}", UNIT.name)
    result = run(*argv)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stderr
    # Unknown keys and unparsable values are only warnings: any output is a defect.
    assert not result.stderr.strip() and not result.stdout.strip(), result.stderr
    # The check is real: without an executable at ExecStart, verify fails.
    binary.chmod(0o644)
    assert run(*argv).returncode != 0


def test_unit_sandbox_exposure_is_low() -> None:
    result = run(tool("systemd-analyze"), "security", "--offline=true", str(UNIT))
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", result.stdout)
    assert match, result.stdout + result.stderr
    print(f"systemd-analyze security: exposure {match.group(1)} {match.group(2)}")
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_install_script_is_strict_and_matches_the_unit() -> None:
    result = run("bash", "-n", str(INSTALL))
    assert result.returncode == 0, result.stderr
    text = INSTALL.read_text()
    assert re.search(r"^set -euo pipefail$", text, re.MULTILINE)
    venv = re.search(r"^venv=(.*)$", text, re.MULTILINE)
    prefix = re.search(r"^prefix=(.*)$", text, re.MULTILINE)
    assert venv and prefix
    binary = venv.group(1).replace("$prefix", prefix.group(1)) + "/bin/mtp-proxy"
    assert unit_value("ExecStart").split()[0] == binary
    assert "systemctl daemon-reload" in text and "enable --now" in text
    assert '[ ! -e "$etc/config.toml" ]' in text  # never overwrites an operator's config

"""Add mtp-proxy's scrape job and alert rules to a Prometheus configuration, once.

    python add_to_prometheus.py /etc/prometheus/prometheus.yml RULES_FILE EXAMPLE_CONFIG

Run by deploy/systemd/install.sh --prometheus with the service's virtualenv (PyYAML arrives
with the gguf dependency). The job is deploy/prometheus/prometheus.yml's `mtp-proxy` job; the
rules file is added to `rule_files`. Nothing changes when both are there already. A changed file
is rewritten by PyYAML, which drops its comments: the original is kept beside it as
prometheus.yml.before-mtp-proxy.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

JOB = "mtp-proxy"


def add(config: dict[str, Any], rules: str, job: dict[str, Any]) -> list[str]:
    """Add the job and the rules file to `config` in place; what was added, in words."""
    added = []
    rule_files = config.get("rule_files") or []
    if rules not in rule_files:
        config["rule_files"] = [*rule_files, rules]
        added.append(f"rule file {rules}")
    jobs = config.get("scrape_configs") or []
    if not any(existing.get("job_name") == JOB for existing in jobs):
        config["scrape_configs"] = [*jobs, job]
        added.append(f"scrape job {JOB}")
    return added


def main(argv: list[str]) -> int:
    target, rules, example = Path(argv[1]), argv[2], Path(argv[3])
    config = yaml.safe_load(target.read_text()) or {}
    jobs = yaml.safe_load(example.read_text())["scrape_configs"]
    job = next(j for j in jobs if j["job_name"] == JOB)
    added = add(config, rules, job)
    if not added:
        print(f"{target}: the {JOB} job and its rules are there already")
        return 0
    backup = target.with_name(target.name + ".before-mtp-proxy")
    if not backup.exists():
        shutil.copy2(target, backup)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"{target}: added {' and '.join(added)} (the file as it was: {backup})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

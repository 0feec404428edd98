"""Which routing state file a service reads, and where that comes from.

``routing.state_file`` is the config file's, unless the environment of the service overrides it
with ``MTP_PROXY_ROUTING__STATE_FILE`` (environment beats the file). The environment that counts
is the service's: under systemd, its unit's (deploy/systemd/mtp-proxy.service sets the variable),
not the shell's that runs ``check-config`` or ``tune``. So when a systemd unit runs this config
(``serve --config`` with the same file), its ``Environment=`` decides; otherwise the current
environment does, as for ``mtp-proxy serve`` started from this shell.

``systemctl show`` is read when systemctl exists; nothing here needs the unit to be running.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_VAR = "MTP_PROXY_ROUTING__STATE_FILE"
UNIT = "mtp-proxy.service"
_PROPERTIES = "Environment,ExecStart,LoadState,ActiveState,MainPID"


@dataclass(frozen=True)
class Unit:
    """A systemd unit, as ``systemctl show`` describes it."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    config: Path | None = None  # the --config of its ExecStart
    active: bool = False
    main_pid: int | None = None

    def runs(self, config: Path) -> bool:
        return self.config is not None and _same(self.config, config)


@dataclass(frozen=True)
class StateFile:
    path: Path | None
    source: str
    """Where the value comes from, in words: the environment variable of a unit or of this
    shell, the config file, or nothing set."""

    def describe(self) -> str:
        where = "none (learned statistics are not kept)" if self.path is None else str(self.path)
        return f"{where}, from {self.source}"


def effective_state_file(
    config: Path,
    *,
    environ: Mapping[str, str] | None = None,
    unit: Unit | None = None,
) -> StateFile:
    """The state file a service running ``config`` reads, and why (see the module docstring).
    ``unit``: the systemd unit (``read_unit()``), None where there is none."""
    if unit is not None and unit.runs(config):
        value = unit.environment.get(ENV_VAR)
        if value:
            return StateFile(Path(value), f"{ENV_VAR} in the environment of {unit.name}")
    else:
        value = (os.environ if environ is None else environ).get(ENV_VAR)
        if value:
            return StateFile(Path(value), f"{ENV_VAR} in this environment")
    in_file = file_state_file(config)
    if in_file is not None:
        return StateFile(in_file, f"routing.state_file in {config}")
    return StateFile(None, f"nothing: neither {ENV_VAR} nor routing.state_file is set")


def file_state_file(config: Path) -> Path | None:
    """routing.state_file as the file itself says (no environment applied)."""
    try:
        data = tomllib.loads(config.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    routing = data.get("routing")
    value = routing.get("state_file") if isinstance(routing, dict) else None
    return Path(value) if isinstance(value, str) and value else None


def read_unit(name: str = UNIT, systemctl: str | None = None) -> Unit | None:
    """The unit as ``systemctl show`` has it; None without systemctl or such a unit."""
    binary = systemctl or shutil.which("systemctl")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "show", name, f"--property={_PROPERTIES}", "--no-pager"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_show(name, done.stdout) if done.returncode == 0 else None


def parse_show(name: str, text: str) -> Unit | None:
    """``systemctl show --property=...`` output -> Unit (None when the unit is not loaded)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            props[key] = value
    if props.get("LoadState") != "loaded":
        return None
    environment = {}
    for item in shlex.split(props.get("Environment", "")):
        key, eq, value = item.partition("=")
        if eq:
            environment[key] = value
    pid = props.get("MainPID", "0")
    return Unit(
        name=name,
        environment=environment,
        config=_config_of(props.get("ExecStart", "")),
        active=props.get("ActiveState") in ("active", "reloading"),
        main_pid=int(pid) if pid.isdigit() and int(pid) > 0 else None,
    )


def _config_of(exec_start: str) -> Path | None:
    """The --config of an ExecStart property ('{ path=... ; argv[]=... --config X ; ... }')."""
    _, found, rest = exec_start.partition("argv[]=")
    if not found:
        return None
    argv = rest.split(" ; ")[0].split()
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--config="):
            return Path(arg.removeprefix("--config="))
    return None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b

"""The environment of the service: which settings it overrides, where each variable was set
(this shell, or the systemd unit's Environment=), what the file says, and the learned file in
force. `check-config` prints them; `tune --apply` seeds that learned file.

Environment variables beat the file (`MTP_PROXY_ROUTING__LEARNED_FILE` over `routing.learned_file`),
and the unit installed by deploy/systemd/install.sh sets some: without this report a value in
the file can be silently not the one in force. The unit counts when its ExecStart serves the
config at hand; its assignments then beat this shell's.

The unit is read from its files (the unit and its `.d/*.conf` drop-ins), not from
`systemctl show`: that works where no systemd answers (a container, the install sandbox's
stand-in systemctl) and for any user, and it names the file that set each variable.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from proxy.config.reference import ENV_PREFIX, setting_docs, toml_value

UNIT = Path("/etc/systemd/system/mtp-proxy.service")
"""Where deploy/systemd/install.sh installs the unit."""
LEARNED_FILE_VARIABLE = f"{ENV_PREFIX}ROUTING__LEARNED_FILE"
FORMER_LEARNED_FILE_VARIABLE = f"{ENV_PREFIX}ROUTING__STATE_FILE"  # its former name, still read
NOT_SETTINGS = frozenset({"MTP_PROXY_ADMIN_KEY"})
"""MTP_PROXY_* variables that are not settings: `mtp-proxy status` reads this one."""
_REDACTED = '"[redacted]"'


@dataclass(frozen=True)
class Variable:
    """One MTP_PROXY_* variable and where it was set: "environment" or a unit file's path."""

    name: str
    value: str
    origin: str


@dataclass(frozen=True)
class Override:
    """A setting an environment variable sets, whatever the file says."""

    key: str  # dotted: "routing.learned_file"
    variable: Variable
    value: str  # the effective value as TOML, a secret redacted
    file_value: str | None  # what the file says, as TOML; None: the file does not set it

    def line(self) -> str:
        said = (
            f"the file says {self.file_value}"
            if self.file_value is not None
            else "the file does not set it"
        )
        return (
            f"{self.key} = {self.value} from {self.variable.name} "
            f"({_origin_words(self.variable.origin)}; {said})"
        )


@dataclass(frozen=True)
class LearnedFileInForce:
    """The learned-statistics file in force (None: not kept) and what set it, in words."""

    path: Path | None
    source: str

    def line(self) -> str:
        if self.path is None:
            return (
                f"learned statistics: not kept ({self.source}): every start begins from the priors"
            )
        return f"learned statistics: {self.path} (from {self.source})"


def environment_variables(environ: Mapping[str, str]) -> dict[str, Variable]:
    """The MTP_PROXY_* variables of a process environment, keyed by upper-case name."""
    return {
        name.upper(): Variable(name, value, "environment")
        for name, value in environ.items()
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in NOT_SETTINGS
    }


def unit_variables(unit: Path) -> dict[str, Variable]:
    """The MTP_PROXY_* assignments of a unit's Environment= lines and its drop-ins
    (UNIT.d/*.conf, in name order), as systemd applies them: a later one wins, and an empty
    `Environment=` clears what came before."""
    assigned: dict[str, Variable] = {}
    for path in [unit, *sorted(Path(f"{unit}.d").glob("*.conf"))]:
        for value in directive_values(path, "Environment"):
            if not value.strip():
                assigned.clear()
                continue
            for word in shlex.split(value):
                name, eq, text = word.partition("=")
                if eq and name.upper().startswith(ENV_PREFIX):
                    assigned[name.upper()] = Variable(name, text, str(path))
    return assigned


def unit_config_file(unit: Path) -> Path | None:
    """The `--config FILE` of the unit's ExecStart, or None."""
    for value in directive_values(unit, "ExecStart"):
        words = shlex.split(value)
        for i, word in enumerate(words):
            if word == "--config" and i + 1 < len(words):
                return Path(words[i + 1])
            if word.startswith("--config="):
                return Path(word.partition("=")[2])
    return None


def service_variables(
    config: Path, environ: Mapping[str, str], unit: Path | None = None, *, installed: Path = UNIT
) -> dict[str, Variable]:
    """The MTP_PROXY_* variables a service of `config` is given: `environ`'s, and over them the
    unit's (`unit`, or the `installed` one when its ExecStart serves `config`)."""
    variables = environment_variables(environ)
    unit = service_unit(config, unit, installed=installed)
    if unit is not None:
        variables.update(unit_variables(unit))
    return variables


def service_unit(config: Path, unit: Path | None = None, *, installed: Path = UNIT) -> Path | None:
    """The unit that runs `config` as a service: `unit` when named, else the `installed` one
    when its ExecStart serves `config`, else None."""
    if unit is None and unit_runs(config, installed):
        return installed
    return unit


def unit_user(unit: Path | None) -> str | None:
    """The user a unit runs its service as: its last User= (drop-ins included), root without
    one; None: no unit (whoever runs `mtp-proxy serve`)."""
    if unit is None:
        return None
    names = [
        value
        for path in [unit, *sorted(Path(f"{unit}.d").glob("*.conf"))]
        for value in directive_values(path, "User")
    ]
    return names[-1] if names and names[-1] else "root"


def overrides(
    settings: BaseModel, file_data: Mapping[str, Any], variables: Mapping[str, Variable]
) -> tuple[list[Override], list[Variable]]:
    """(the settings the variables set, the variables that name no setting)."""
    by_variable = {doc.env_var: doc for doc in setting_docs() if doc.env_var is not None}
    by_variable[FORMER_LEARNED_FILE_VARIABLE] = by_variable[LEARNED_FILE_VARIABLE]
    found, unknown = [], []
    for name, variable in sorted(variables.items()):
        doc = by_variable.get(name)
        if doc is None:
            unknown.append(variable)
            continue
        path = doc.key.split(".")
        file_value = _lookup(file_data, path)
        if file_value is _MISSING and doc.key == "routing.learned_file":
            file_value = _lookup(file_data, ["routing", "state_file"])  # its former name
        secret = "SecretStr" in str(doc.field.annotation)
        found.append(
            Override(
                key=doc.key,
                variable=variable,
                value=_REDACTED if secret else _shown(_attribute(settings, path)),
                file_value=(
                    None
                    if file_value is _MISSING
                    else (_REDACTED if secret else _shown(file_value))
                ),
            )
        )
    return found, unknown


def effective_learned_file(config: Path, variables: Mapping[str, Variable]) -> LearnedFileInForce:
    """The learned-statistics file a service of `config` reads with `variables`
    (service_variables), and what set it: the variable, else the file's routing.learned_file."""
    variable = variables.get(LEARNED_FILE_VARIABLE) or variables.get(FORMER_LEARNED_FILE_VARIABLE)
    if variable is not None:
        source = f"{variable.name} ({_origin_words(variable.origin)})"
        return LearnedFileInForce(Path(variable.value), source)
    try:
        data: Any = tomllib.loads(config.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        data = {}
    value = _lookup(data, ["routing", "learned_file"])
    if value is _MISSING:
        value = _lookup(data, ["routing", "state_file"])  # its former name, still read
    if isinstance(value, str) and value:
        return LearnedFileInForce(Path(value), "the file's routing.learned_file")
    return LearnedFileInForce(None, "routing.learned_file unset")


def same_file(one: Path, other: Path) -> bool:
    """Whether two paths name one file (links followed; by name where one cannot be read)."""
    try:
        return one.samefile(other)
    except OSError:
        return one.resolve() == other.resolve()


def unit_runs(config: Path, unit: Path = UNIT) -> bool:
    """Whether the unit's ExecStart serves `config`."""
    runs = unit_config_file(unit)
    return runs is not None and same_file(runs, config)


_MISSING = object()


def _lookup(data: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(data, Mapping) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _attribute(settings: Any, path: list[str]) -> Any:
    for part in path:
        settings = getattr(settings, part)
    return settings


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [item.model_dump(mode="json") for item in value]
    try:
        return toml_value(value)
    except TypeError:
        return repr(value)


def _origin_words(origin: str) -> str:
    return "this shell's environment" if origin == "environment" else f"Environment= in {origin}"


def directive_values(path: Path, directive: str) -> list[str]:
    """The values of `directive=` lines of a unit file (continuation lines joined)."""
    try:
        text = path.read_text("utf-8")
    except OSError:
        return []
    values = []
    for line in text.replace("\\\n", " ").splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name.strip() == directive:
            values.append(value.strip())
    return values

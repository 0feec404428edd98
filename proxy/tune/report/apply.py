"""``tune --apply CONFIG``: the recommendation written where the service reads it, then a reload.

1. The config: the model's ``[[models.profiles]]`` become the recommended ones (a profile of the
   same name keeps its other keys, e.g. ``env``; a pool's new profile gets the old profiles'
   ``env``: their GPU), ``[routing]`` gets the roles (the deepest speculative profile plays
   max, the next min), the rest of the file is kept as written (comments too), the old file is
   kept as ``CONFIG.<time>.bak``, and the new one must validate before it replaces the old. A
   model served by one process keeps its process's start-up depth (``draft_n_max`` on the
   model): the process then runs with the same flags, and a reload does not replace it (a
   start-first replacement would need room for a second copy of the weights).
2. The seeded state: into the learned file the service reads (``/admin/service`` through
   ``--url``; else the environment of its systemd unit, this shell's, or the file:
   proxy.config.overrides), added to what is already learned there.
3. The reload: SIGHUP to the service (it re-reads the config and, since the learned file was
   replaced by another writer, loads it: proxy.lifecycle.reload); for a service under systemd, or
   one tune may not signal, the line to type (``sudo systemctl reload mtp-proxy``). The unit's main
   process is the one thing asked of systemd (``systemctl show``): no file says it.

A run whose recommendation is provisional is not applied: it recommends nothing over off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import AoT, Table

from proxy.config.overrides import LearnedFileInForce
from proxy.config.routing import RoutingSettings
from proxy.config.settings import ConfigError, load_settings
from proxy.routing.stats import LearnedStats
from proxy.tune.report.recommend import Recommendation

_DRAFT_KEYS = ("spec_type", "draft_n_max", "draft_n_min", "draft_p_min", "draft_model")


class ApplyError(RuntimeError):
    """The recommendation could not be applied; the message says what to do instead."""


def write_config(
    config: Path,
    model: str,
    rec: Recommendation,
    out: Path,
    *,
    keep_start_depth: int | None = None,
) -> list[str]:
    """Write the recommended profiles and roles into ``config`` (backup kept); the lines saying
    what was done. ApplyError when the result would not validate or cannot be written."""
    try:
        original = config.read_text("utf-8")
    except OSError as exc:
        raise ApplyError(f"cannot read {config}: {exc}") from None
    doc = tomlkit.parse(original)
    entry = _model_entry(doc, model, config)
    old = [dict(p) for p in entry.get("profiles", [])]
    pool = entry.get("draft_control") == "per-process"
    entry["profiles"] = _profiles(rec, old, pool=pool)
    if keep_start_depth is not None and entry.get("draft_n_max") is None:
        deepest = max((p.setting.n_max or 0) for p in rec.profiles)
        if 0 < deepest < keep_start_depth:
            entry["draft_n_max"] = keep_start_depth
    routing = doc.get("routing")
    if not isinstance(routing, Table):
        routing = tomlkit.table()
        doc["routing"] = routing
    for key, value in rec.roles().items():
        routing[key] = value
    text = tomlkit.dumps(doc)
    _validate(text, config)
    backup = config.with_name(f"{config.name}.{datetime.now(UTC):%Y%m%dT%H%M%SZ}.bak")
    try:
        shutil.copy2(config, backup)
        _replace(config, text)
    except OSError as exc:
        kept = out / "config.applied.toml"
        kept.write_text(text, "utf-8")
        raise ApplyError(
            f"cannot write {config} ({exc.strerror}): the new config is {kept}; install it "
            f"with: sudo cp {kept} {config}"
        ) from None
    names = ", ".join(p.name for p in rec.profiles)
    roles = ", ".join(f"{k} = {v}" for k, v in rec.roles().items())
    return [f"{config}: model {model} profiles {names}; [routing] {roles} (was kept as {backup})"]


def _model_entry(doc: Any, model: str, config: Path) -> Table:
    models = doc.get("models")
    if isinstance(models, AoT | list):
        for entry in models:
            if entry.get("name") == model:
                return entry  # type: ignore[no-any-return]
    raise ApplyError(f"{config} has no [[models]] entry named {model!r}")


def _profiles(rec: Recommendation, old: list[dict[str, Any]], *, pool: bool) -> AoT:
    by_name = {str(p.get("name")): p for p in old}
    # A pool's processes may run on GPUs of their own: a new profile gets the old ones' env.
    env = next((p["env"] for p in old if "env" in p), None) if pool else None
    tables = []
    for profile in rec.profiles:
        table = tomlkit.table()
        table["name"] = profile.name
        for key, value in profile.setting.profile_fields().items():
            table[key] = value
        kept = by_name.get(profile.name)
        extra = {k: v for k, v in (kept or {}).items() if k not in (*_DRAFT_KEYS, "name")}
        if kept is None and env is not None:
            extra = {"env": env}
        for key, value in extra.items():
            table[key] = value
        tables.append(table)
    return AoT(tables)


def _validate(text: str, config: Path) -> None:
    """The new config must load as the service would load it, or nothing is written."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=config.parent, delete=False) as f:
        f.write(text)
        trial = Path(f.name)
    try:
        load_settings(trial)
    except ConfigError as exc:
        problems = "; ".join(exc.problems)
        raise ApplyError(f"the applied config would not validate: {problems}") from None
    except OSError as exc:
        raise ApplyError(f"cannot check the new config: {exc}") from None
    finally:
        trial.unlink(missing_ok=True)


def _replace(path: Path, text: str) -> None:
    """Atomically, keeping the file's mode and owners (the service reads it as its own user)."""
    before = path.stat()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        _own(Path(tmp), _owner_of(before))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


Owner = tuple[int, int, int]  # mode, uid, gid


def _owner_of(info: os.stat_result) -> Owner:
    return (info.st_mode & 0o7777, info.st_uid, info.st_gid)


def _own(path: Path, owner: Owner) -> None:
    """Give ``path`` a mode and owners (the owners only where allowed: as root)."""
    mode, uid, gid = owner
    os.chmod(path, mode)
    if (uid, gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(PermissionError):  # not root: then the file is ours anyway
            os.chown(path, uid, gid)


def write_state(
    where: LearnedFileInForce, seed: Any, routing: RoutingSettings, out: Path
) -> tuple[list[str], bool | None]:
    """Seed the learned file in force: ``seed(base)`` adds the measurements to the state loaded
    from it. The lines saying what was done, and whether the file was written (None: no file
    is in force, so there is none to seed: the service learns from its requests)."""
    if where.path is None:
        return [
            f"learned file: none in force ({where.source}), so none seeded; the seeded state is "
            f"{out / 'routing-state.json'}: set routing.learned_file (or the environment "
            "variable) to a copy of it and restart the service to start warm"
        ], None
    base = LearnedStats.load(where.path, routing)
    stats: LearnedStats = seed(base)
    try:
        # The service reads and rewrites it as its own user: the old file's owners and mode
        # (or, for a new one, its folder's owners: systemd's StateDirectory).
        owner = _state_owner(where.path)
        stats.save(where.path)
        if owner is not None:
            _own(where.path, owner)
    except OSError as exc:
        return [
            f"cannot write {where.path} ({exc.strerror}); install the seeded state with: sudo "
            f"install -o mtp-proxy -g mtp-proxy -m 0600 {out / 'routing-state.json'} {where.path}"
        ], False
    return [f"learned file: {where.path} ({where.source}) seeded; before: {base.load_report}"], True


def _state_owner(path: Path) -> Owner | None:
    """The learned file's mode and owners; for a new one, its folder's owners (None: unknown)."""
    try:
        return _owner_of(path.stat())
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        folder = path.parent.stat()
    except OSError:
        return None
    group = 0o040 if folder.st_mode & 0o050 else 0  # group-readable where the folder is
    return (0o600 | group, folder.st_uid, folder.st_gid)


@dataclass(frozen=True)
class UnitProcess:
    """The main process of a systemd unit that is running."""

    unit: str  # "mtp-proxy.service"
    pid: int


def unit_process(unit: str, systemctl: str | None = None) -> UnitProcess | None:
    """The unit's main process, as ``systemctl show`` has it; None without systemctl (or
    systemd), or when the unit is not running."""
    binary = systemctl or shutil.which("systemctl")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "show", unit, "--property=ActiveState,MainPID", "--no-pager"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_show(unit, done.stdout) if done.returncode == 0 else None


def parse_show(unit: str, text: str) -> UnitProcess | None:
    """``systemctl show --property=ActiveState,MainPID`` -> its main process, None unless it
    runs (a unit starting up may not have its SIGHUP handler yet)."""
    props = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        props[key] = value
    pid = props.get("MainPID", "0")
    if props.get("ActiveState") not in ("active", "reloading") or not pid.isdigit():
        return None
    return UnitProcess(unit, int(pid)) if int(pid) > 0 else None


@dataclass(frozen=True)
class Reload:
    """What the reload came to: its line, the pid signalled (None: none), and whether the
    service will serve the applied files (signalled, or not running: it starts with them)."""

    line: str
    pid: int | None
    done: bool


def reload_service(
    pid: int | None, unit: UnitProcess | None, *, unreachable: str | None = None
) -> Reload:
    """Ask the service to reload (SIGHUP, as the unit's ExecReload does). ``unit``: the running
    unit that serves the config. ``unreachable``: why a service that runs cannot be signalled
    by tune (it reads another file, its pid is unknown): said as not done, never as "not
    running"."""
    if pid is None and unit is not None:
        pid = unit.pid
    if pid is None:
        if unreachable is not None:
            return Reload(unreachable, None, False)
        return Reload("the service is not running: it starts with the applied config", None, True)
    try:
        os.kill(pid, signal.SIGHUP)
    except PermissionError:
        if unit is not None and unit.pid == pid:
            line = f"sudo systemctl reload {unit.unit.removesuffix('.service')}"
        else:
            line = f"sudo kill -HUP {pid}"
        return Reload(f"not allowed to signal the service (pid {pid}): reload it with `{line}`",
                      None, False)  # fmt: skip
    except ProcessLookupError:
        return Reload(f"the service (pid {pid}) is gone: it starts with the applied config", None,
                      True)  # fmt: skip
    return Reload(f"reload asked of the service (SIGHUP to pid {pid})", pid, True)

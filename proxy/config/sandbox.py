"""The service unit's sandbox: which paths it hides from the service (ProtectHome=,
PrivateTmp=) or keeps read-only (ProtectSystem=, ReadOnlyPaths=), and the drop-in that opens
one. Without this a model under the user's ~/models passed `init` and `check-config`, and the
first sign was a service that could not start.

Read from the unit's files (the unit and its `.d/*.conf` drop-ins, the later line winning), as
proxy.config.overrides reads its Environment=; SHIPPED is what deploy/systemd/mtp-proxy.service
sets, for `init` on a box where the unit is not installed yet (tests/unit/test_sandbox.py keeps
the two equal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from proxy.config.overrides import UNIT, directive_values

HOMES = (Path("/home"), Path("/root"), Path("/run/user"))
TMPS = (Path("/tmp"), Path("/var/tmp"))  # noqa: S108 (PrivateTmp= hides them, not used)
DROP_IN = Path(f"{UNIT}.d/models.conf")
"""Where the printed drop-in goes (any name ending .conf does)."""
_SYSTEM_READ_ONLY = {  # ProtectSystem= value -> what it makes read-only
    "yes": (Path("/usr"), Path("/boot"), Path("/efi")),
    "true": (Path("/usr"), Path("/boot"), Path("/efi")),
    "full": (Path("/usr"), Path("/boot"), Path("/efi"), Path("/etc")),
    "strict": (Path("/"),),
}
_ALWAYS_WRITABLE = (Path("/dev"), Path("/proc"), Path("/sys"))
_DIRECTORY_ROOTS = {  # StateDirectory= and its kin: where each makes a writable folder
    "StateDirectory": Path("/var/lib"),
    "CacheDirectory": Path("/var/cache"),
    "LogsDirectory": Path("/var/log"),
    "RuntimeDirectory": Path("/run"),
}


@dataclass(frozen=True)
class Sandbox:
    """What a unit's sandbox does to paths (only the directives that hide or protect them)."""

    protect_home: str = "no"  # yes, read-only, tmpfs, no
    protect_system: str = "no"  # strict, full, yes, no
    private_tmp: bool = False
    writable: tuple[Path, ...] = ()  # ReadWritePaths= and the StateDirectory= kind
    read_only: tuple[Path, ...] = ()  # ReadOnlyPaths=
    bound: tuple[Path, ...] = ()  # BindPaths= and BindReadOnlyPaths= (their target)
    unit: Path | None = None  # the file it was read from; None: SHIPPED

    def hides(self, path: Path) -> str | None:
        """Why the service cannot see `path` (a file it reads), or None when it can."""
        if any(_under(path, bind) for bind in self.bound):
            return None
        home = next((h for h in HOMES if _under(path, h)), None)
        if home is not None and self.protect_home in ("yes", "true", "tmpfs"):
            return f"ProtectHome={self.protect_home} hides /home, /root and /run/user"
        tmp = next((t for t in TMPS if _under(path, t)), None)
        if tmp is not None and self.private_tmp:
            return f"PrivateTmp=yes gives the service its own empty {tmp}"
        return None

    def forbids_writing(self, path: Path) -> str | None:
        """Why the service cannot write `path` (the learned file), or None when it can."""
        if (hidden := self.hides(path)) is not None:
            return hidden
        if any(_under(path, home) for home in HOMES) and self.protect_home == "read-only":
            return "ProtectHome=read-only makes /home, /root and /run/user read-only"
        if any(_under(path, w) for w in (*self.writable, *_ALWAYS_WRITABLE)):
            return None
        if (ro := next((r for r in self.read_only if _under(path, r)), None)) is not None:
            return f"ReadOnlyPaths= makes {ro} read-only"
        system = _SYSTEM_READ_ONLY.get(self.protect_system, ())
        if any(_under(path, s) for s in system):
            return f"ProtectSystem={self.protect_system} makes it read-only"
        return None


SHIPPED = Sandbox(
    protect_home="yes",
    protect_system="strict",
    private_tmp=True,
    writable=(Path("/var/lib/mtp-proxy"), Path("/var/cache/mtp-proxy")),
    read_only=(Path("/opt/mtp-proxy"), Path("/etc/mtp-proxy")),
)


def read_sandbox(unit: Path) -> Sandbox:
    """The sandbox of a unit file and its drop-ins."""

    def last(directive: str, default: str) -> str:
        values = _values(unit, directive)
        return values[-1].lower() if values and values[-1] else default

    writable = [Path(p) for p in _paths(unit, "ReadWritePaths")]
    for directive, root in _DIRECTORY_ROOTS.items():
        writable += [root / name for name in _words(unit, directive)]
    binds = [*_paths(unit, "BindPaths"), *_paths(unit, "BindReadOnlyPaths")]
    return Sandbox(
        protect_home=last("ProtectHome", "no"),
        protect_system=last("ProtectSystem", "no"),
        private_tmp=last("PrivateTmp", "no") in ("yes", "true", "1", "on"),
        writable=tuple(writable),
        read_only=tuple(Path(p) for p in _paths(unit, "ReadOnlyPaths")),
        bound=tuple(Path((bind.split(":") * 2)[1]) for bind in binds),  # SOURCE[:TARGET[:OPTS]]
        unit=unit,
    )


def service_sandbox(unit: Path | None, *, installed: Path = UNIT) -> Sandbox:
    """The sandbox the service will run in: `unit`'s, else the installed unit's, else the one
    deploy/systemd ships."""
    for candidate in (unit, installed):
        if candidate is not None and candidate.is_file():
            return read_sandbox(candidate)
    return SHIPPED


def read_problem(sandbox: Sandbox, path: Path) -> str | None:
    """Why the service cannot read `path` (or the file it links to), with the drop-in that
    fixes it; None when it can."""
    for seen in (path, Path(os.path.realpath(path))):
        if (why := sandbox.hides(seen)) is not None:
            return read_fix(seen, f"the service cannot see {seen}: {why}{_where(sandbox)}")
    return None


def write_problem(sandbox: Sandbox, path: Path) -> str | None:
    """Why the service cannot write `path` (the learned file), with the fix; None when it
    can."""
    for seen in (path, Path(os.path.realpath(path))):
        if (why := sandbox.forbids_writing(seen)) is not None:
            return write_fix(seen, f"the service cannot write {seen}: {why}{_where(sandbox)}")
    return None


def _where(sandbox: Sandbox) -> str:
    return f" ({sandbox.unit})" if sandbox.unit is not None else " (the unit install.sh installs)"


def read_fix(path: Path, why: str) -> str:
    """The drop-in that lets the service read `path`, in words to paste."""
    if (tmp := next((t for t in TMPS if _under(path, t)), None)) is not None:
        return f"{why}: move it out of {tmp} (to /srv/models, say)"
    folder = path.parent
    return (
        f"{why}. Give the service that folder read-only in a drop-in, {DROP_IN}:\n"
        f"    [Service]\n    ProtectHome=tmpfs\n    BindReadOnlyPaths={folder}\n"
        "(or ProtectHome=read-only, which shows every home), then: sudo systemctl "
        "daemon-reload && sudo systemctl restart mtp-proxy. The service's user must still "
        f"be able to read the file ({_mode_words(path)})"
    )


def write_fix(path: Path, why: str) -> str:
    """The drop-in that lets the service write `path` (the learned file), in words."""
    if any(_under(path, home) for home in (*HOMES, *TMPS)):
        return f"{why}: keep it in /var/lib/mtp-proxy (the unit's StateDirectory=)"
    return (
        f"{why}. Let the service write its folder in a drop-in, {DROP_IN}:\n"
        f"    [Service]\n    ReadWritePaths={path.parent}\n"
        "then: sudo systemctl daemon-reload && sudo systemctl restart mtp-proxy"
    )


def _mode_words(path: Path) -> str:
    try:
        return f"now mode {oct(os.stat(path).st_mode & 0o777)[2:]}"
    except OSError:
        return "it cannot be read from here"


def _under(path: Path, folder: Path) -> bool:
    return PurePosixPath(path).is_relative_to(folder)


def _values(unit: Path, directive: str) -> list[str]:
    return [
        value
        for path in [unit, *sorted(Path(f"{unit}.d").glob("*.conf"))]
        for value in directive_values(path, directive)
    ]


def _words(unit: Path, directive: str) -> list[str]:
    """The space-separated values of a list directive; an empty assignment resets it."""
    words: list[str] = []
    for value in _values(unit, directive):
        words = [] if not value else [*words, *value.split()]
    return words


def _paths(unit: Path, directive: str) -> list[str]:
    """A path list's entries, without the "-" and "+" prefixes systemd allows."""
    return [word.lstrip("-+") for word in _words(unit, directive)]

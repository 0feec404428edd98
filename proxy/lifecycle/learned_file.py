"""The learned file as this proxy last read or wrote it, and writes that are not its own.

The proxy saves its learned statistics to ``routing.learned_file`` now and then and at stop. When
another writer replaces the file meanwhile (``mtp-proxy tune --apply`` seeding it with its
measurements), the proxy must not overwrite that with its own older view: it keeps the file as
it is, saves nothing more, and loads it at the next reload (SIGHUP) or start. The file is known
by its inode, size and modification time after each of the proxy's own reads and writes.

A save that fails (the disk full, the directory gone or read-only) is kept as ``save_failure``
until one succeeds: the admin feed the live page and `mtp-proxy status` read shows it.
"""

from __future__ import annotations

import getpass
import os
import pwd
import time
from pathlib import Path

import structlog

from proxy.config.routing import RoutingSettings
from proxy.routing.stats import LearnedStats, write_atomic

log = structlog.get_logger("proxy.learned_file")

Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class LearnedFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: Stamp = None
        self._warned = False
        self.loaded_at: float | None = None  # wall time of the last load (a reload's too)
        self.save_failure: str | None = None  # the last save's error, until one succeeds

    def load(self, settings: RoutingSettings) -> LearnedStats:
        stats = LearnedStats.load(self.path, settings)
        self._stamp = _stamp(self.path)
        self._warned = False
        self.loaded_at = time.time()
        return stats

    def replaced(self) -> bool:
        """Whether another writer replaced the file since the proxy last read or wrote it (a
        file that is gone is not: the proxy writes it again)."""
        now = _stamp(self.path)
        return now is not None and now != self._stamp

    def save(self, data: bytes) -> bool:
        """Write ``data`` unless another writer's file is waiting to be loaded; True if written.
        Blocking: call it from a thread."""
        if self.replaced():
            if not self._warned:
                log.warning(
                    "learned_file_replaced",
                    path=str(self.path),
                    kept="the file as written by the other writer",
                    action="loaded at the next reload (SIGHUP) or start; nothing saved until then",
                )
                self._warned = True
            return False
        try:
            write_atomic(self.path, data)
        except OSError as exc:
            self.save_failure = f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {exc}"
            raise
        self.save_failure = None
        self._stamp = _stamp(self.path)
        return True


def learned_file_problem(path: Path | None, user: str | None = None) -> str | None:
    """Why the service's user (``user``; None: this process's) cannot keep the learned file at
    ``path``, with the fix; None when it can. A save writes a new file beside it and renames it
    over the old one, so the directory must be writable, every directory above it searchable,
    and a file already there readable and writable (check-config's, before a start)."""
    if path is None:
        return None
    try:
        account = None if user is None else pwd.getpwnam(user)
    except KeyError:
        return f"routing.learned_file {path}: the service's user {user} does not exist on this box"
    who = f"the service's user {user}" if user else "this user"
    owner = user or getpass.getuser()
    if path.exists() and not path.is_file():
        return f"routing.learned_file {path}: not a regular file; name a file (a JSON document)"
    if path.exists() and not _permits(path, account, os.R_OK | os.W_OK):
        fix = f"fix: chown {owner} {path}"
        return f"routing.learned_file {path}: {who} cannot read and write it; {fix}"
    blocked = _first_blocked(path.parent, account)
    if blocked is None:
        return None
    return (
        f"routing.learned_file {path}: {who} cannot write in {blocked}, where each save writes "
        f"a new file and renames it; fix: chown {owner} {blocked} (or set routing.learned_file "
        "to a file in a directory it owns, such as /var/lib/mtp-proxy/learned-stats.json)"
    )


def _first_blocked(directory: Path, account: pwd.struct_passwd | None) -> Path | None:
    """The first directory on the way to ``directory`` (the missing ones are made by a save,
    in their nearest existing parent) that ``account`` cannot search, or the last one, that it
    cannot write in; None when nothing blocks."""
    existing = directory.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    for parent in reversed(existing.parents):
        if not _permits(parent, account, os.X_OK):
            return parent
    return None if _permits(existing, account, os.W_OK | os.X_OK) else existing


def _permits(path: Path, account: pwd.struct_passwd | None, mode: int) -> bool:
    """Whether ``account`` (None: this process) may access ``path`` so (os.R_OK, W_OK, X_OK:
    4, 2, 1, as the mode's bits), by its owner, group and mode bits; root always, but on a
    read-only file system, which stops every user."""
    if account is None:
        return os.access(path, mode)
    if mode & os.W_OK and os.statvfs(path).f_flag & os.ST_RDONLY:
        return False
    if account.pw_uid == 0:
        return True
    info = path.stat()
    if info.st_uid == account.pw_uid:
        shift = 6
    elif info.st_gid in os.getgrouplist(account.pw_name, account.pw_gid):
        shift = 3
    else:
        shift = 0
    return (info.st_mode >> shift) & mode == mode

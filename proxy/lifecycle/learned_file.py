"""The learned file as this proxy last read or wrote it, and writes that are not its own.

The proxy saves its learned statistics to ``routing.state_file`` now and then and at stop. When
another writer replaces the file meanwhile (``mtp-proxy tune --apply`` seeding it with its
measurements), the proxy must not overwrite that with its own older view: it keeps the file as
it is, saves nothing more, and loads it at the next reload (SIGHUP) or start. The file is known
by its inode, size and modification time after each of the proxy's own reads and writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog

from proxy.config.routing import RoutingSettings
from proxy.routing.stats import LearnedStats, write_atomic

log = structlog.get_logger("proxy.state_file")

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
                    "state_file_replaced",
                    path=str(self.path),
                    kept="the file as written by the other writer",
                    action="loaded at the next reload (SIGHUP) or start; nothing saved until then",
                )
                self._warned = True
            return False
        write_atomic(self.path, data)
        self._stamp = _stamp(self.path)
        return True

"""Sessions and the prompt caches that hold them: which backend holds a session's cache.

llama-server keeps each conversation's KV cache in the slot that served it, so a session's next
turn is placed where its cache is (``holder``), unless the slot was since given to another
(``SlotCaches``: llama-server's least-recently-used slots). Bounded: at most ``max_sessions``
sessions, each forgotten after ``session_idle_ttl_s`` idle.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from proxy.config.routing import RoutingSettings
from proxy.routing.slot_caches import SlotCaches


class Sessions:
    def __init__(self, settings: RoutingSettings) -> None:
        self.settings = settings
        self.caches = SlotCaches()
        # key -> (backend, last used), least recently used first
        self._holders: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def holder(self, session_key: str | None) -> str | None:
        """The backend that holds the session's prompt cache, if one still does."""
        if session_key is None:
            return None
        entry = self._holders.get(session_key)
        if entry is None:
            return None
        name, last_used = entry
        if time.monotonic() - last_used > self.settings.session_idle_ttl_s:
            del self._holders[session_key]
            return None
        return name if self.caches.holds(name, session_key) else None

    def place(self, backend: str, session_key: str | None, tokens: int, slots: int) -> object:
        """A request placed on ``backend``: the session is held there, and the request takes a
        slot's cache; returns what that slot is known by until ``release``."""
        if session_key is not None:
            self._remember(session_key, backend)
        return self.caches.use(backend, session_key, tokens, slots)

    def release(self, backend: str, key: object) -> None:
        self.caches.release(backend, key)

    def forget_idle(self) -> int:
        """Drop sessions idle past the TTL (bounded memory); returns how many went."""
        cutoff = time.monotonic() - self.settings.session_idle_ttl_s
        stale = [key for key, (_, used) in self._holders.items() if used < cutoff]
        for key in stale:
            del self._holders[key]
        return len(stale)

    def _remember(self, session_key: str, backend: str) -> None:
        holders = self._holders
        holders[session_key] = (backend, time.monotonic())
        holders.move_to_end(session_key)
        while len(holders) > self.settings.max_sessions:
            holders.popitem(last=False)

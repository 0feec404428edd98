"""Which sessions' prompt caches each backend still holds, modelled on llama-server's slots."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping


class SlotCaches:
    """Which sessions' prompt caches each backend still holds, modelled on llama-server's slots.

    A request of a session whose prefix a slot holds reuses that slot; any other request takes
    the least recently used *idle* slot and overwrites its cache (a slot serving a request
    cannot be taken). So a backend with N slots holds the caches of the sessions it served
    last, and a long request in progress keeps its cache however many short ones pass by:
    counting it as the next victim made short requests shun a backend they could share.
    """

    def __init__(self) -> None:
        self._lru: dict[str, OrderedDict[object, int]] = {}  # key -> cached prompt tokens
        self._busy: dict[str, OrderedDict[object, int]] = {}  # key -> requests in flight

    def use(self, backend: str, session_key: str | None, tokens: int, slots: int) -> object:
        """A request goes to the backend; returns the key to ``release`` it with."""
        lru = self._lru.setdefault(backend, OrderedDict())
        busy = self._busy.setdefault(backend, OrderedDict())
        key: object = session_key if session_key is not None else object()
        lru[key] = tokens
        lru.move_to_end(key)
        busy[key] = busy.get(key, 0) + 1
        while len(lru) > max(slots, 1):
            victim = next((k for k in lru if k not in busy), next(iter(lru)))
            del lru[victim]
        return key

    def release(self, backend: str, key: object) -> None:
        """The request is done: its slot may be taken by another session from now on."""
        busy = self._busy.get(backend)
        if busy is None or key not in busy:
            return
        busy[key] -= 1
        if busy[key] <= 0:
            del busy[key]

    def trim(self, backend: str, in_flight: int, slots: int) -> None:
        """Drop busy marks that cannot be right: requests that failed are never released.
        An idle backend has none; otherwise at most ``slots`` more than its in-flight count
        are kept (a finished request's release may still be on its way: /metrics round trip,
        so the newest marks are not dropped just because the count is ahead of them)."""
        busy = self._busy.get(backend)
        if not busy:
            return
        if in_flight <= 0:
            busy.clear()
            return
        while busy and sum(busy.values()) > in_flight + max(slots, 1):
            del busy[next(iter(busy))]

    def resident(self, backend: str, session_key: str | None, min_tokens: int) -> int:
        """Other sessions whose cached prompt of at least ``min_tokens`` the backend holds."""
        if min_tokens <= 0:
            return 0
        lru: Mapping[object, int] = self._lru.get(backend, {})
        return sum(
            1 for k, n in lru.items() if n >= min_tokens and type(k) is str and k != session_key
        )

    def holds(self, backend: str, session_key: str) -> bool:
        return session_key in self._lru.get(backend, ())

    def victim_tokens(self, backend: str, session_key: str | None, slots: int) -> int:
        """Cached tokens a request of this session would overwrite on the backend: the least
        recently used idle slot's (the least recently used one when none is idle)."""
        lru = self._lru.get(backend)
        if not lru or len(lru) < slots or (session_key is not None and session_key in lru):
            return 0
        busy: Mapping[object, int] = self._busy.get(backend, {})
        idle = next((k for k in lru if k not in busy), None)
        return lru[idle] if idle is not None else next(iter(lru.values()))

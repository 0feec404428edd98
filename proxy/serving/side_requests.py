"""Side requests kept off the agent's slot: which requests are side requests (pure rules of
``[side_requests]``) and the ``id_slot`` each request is sent with.

Claude Code sends small side requests (titles, claude-haiku-* calls) beside its main turns. On
one slot each takes the only slot, and llama-server saves the agent's long context to host
memory and loads it back (or drops it when --cache-ram is too small): the next turn re-reads it.
With a slot kept for them, the side requests go there and the agent's prefix stays where it is.
"""

from __future__ import annotations

import fnmatch

from proxy.config.side_requests import SideRequestSettings
from proxy.routing.features import RequestFeatures

SLOT_KEY = "id_slot"
"""llama-server's per-request slot: the request waits for that slot, and runs there."""


def side_rule(
    features: RequestFeatures,
    client_model: str,
    live_session: str | None,
    settings: SideRequestSettings,
) -> str | None:
    """The rule that makes this a side request (for the log), or None: a main request.
    ``client_model``: the name the client sent (features carry the served model's)."""
    pattern = settings.model_pattern
    if pattern and fnmatch.fnmatchcase(client_model.lower(), pattern.lower()):
        return f"model {pattern}"
    shape = []
    if settings.no_tools:
        if features.has_tools:
            return None
        shape.append("no tools")
    if settings.max_tokens is not None:
        asked = features.max_tokens
        if asked is None or asked > settings.max_tokens:
            return None
        shape.append(f"max_tokens <= {settings.max_tokens}")
    if settings.other_session:
        key = features.session_key
        if key is not None and key == live_session:
            return None
        shape.append("not the live agent's session")
    return ", ".join(shape) or None


def slot_of(side: bool, slots: int, settings: SideRequestSettings, *, busy: bool) -> int | None:
    """The id_slot a request gets on a backend of ``slots`` slots: the kept slot for a side
    request; on two slots the other one for the rest while nothing else is in flight there
    (``busy``: a second turn pinned to the agent's slot would queue inside llama-server
    beside an idle slot, so it goes wherever llama-server puts it); None: llama-server
    chooses (no slot kept, or the backend has too few)."""
    kept = settings.slot
    if kept is None or slots <= kept or slots < 2:
        return None
    if side:
        return kept
    return 1 - kept if slots == 2 and not busy else None

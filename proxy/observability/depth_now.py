"""The depth a backend runs now, with an answer on a one-slot process too.

A busy epoch's depth (``mtp_proxy_backend_busy_depth``) exists only on a process that was busy,
which a one-slot process (``-np 1``, what ``mtp-proxy init`` writes on one GPU) never is. This
is the depth of the request decoding on it now or, when none is, of the last request it served:
the answer to "which depth runs here" on every shape. Read by the metric
``mtp_proxy_backend_depth`` (``proxy.observability.collectors``) and the live page's cards
(``proxy.serving.live``), so both say the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from proxy.observability.recent import Finished

Source = Literal["decoding", "last", "pool"]


@dataclass(frozen=True, slots=True)
class DepthNow:
    depth: int
    source: Source
    """decoding: a request decoding now (several at different depths: the deepest); last: the
    last request it served, none decoding now; pool: a pool process runs its profile only."""
    profile: str | None
    at: float | None = None
    """Unix time the last request ended (source ``last``)."""


def depth_now(
    decoding: Mapping[str, int],
    depths: Mapping[str, int],
    last: Finished | None,
    pool_profile: str | None = None,
) -> DepthNow | None:
    """``decoding``: profile -> requests decoding on the backend now; ``depths``: profile ->
    depth of its model; ``last``: its last finished request; ``pool_profile``: the profile of a
    pool process (None on one process). None: nothing decodes and nothing was served yet."""
    if pool_profile is not None:
        depth = depths.get(pool_profile)
        return None if depth is None else DepthNow(depth, "pool", pool_profile)
    known = [(depths[p], p) for p in decoding if p in depths]
    if known:
        depth, profile = max(known)
        return DepthNow(depth, "decoding", profile)
    if last is None or last.profile is None:
        return None
    depth = last.depth if last.depth is not None else depths.get(last.profile)
    return None if depth is None else DepthNow(depth, "last", last.profile, last.at)

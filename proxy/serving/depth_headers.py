"""The depth and speculative type each generated answer carries, beside ``X-MTP-Profile``.

``X-MTP-Depth``: the draft depth the request was generated at (its per-request depth on one
process; its profile's ``draft_n_max`` on a process of its own; 0 when it does not draft).
``X-MTP-Spec-Type``: what the backend drafts with (llama-server's --spec-type, ``none``).
A balancer, a log pipeline or a client reads them without asking the proxy anything else.
"""

from __future__ import annotations

from proxy.config.settings import Settings
from proxy.plans.speculation import NONE, Speculation

DEPTH_HEADER = "X-MTP-Depth"
SPEC_TYPE_HEADER = "X-MTP-Spec-Type"


def depth_headers(
    settings: Settings,
    speculation: dict[str, Speculation],
    *,
    model: str,
    profile: str,
    backend: str,
    depth: int | None,
) -> dict[str, str]:
    """The two headers of a request served by ``backend`` under ``profile``; ``depth`` is the
    per-request depth sent with it (None: the backend's own, its profile's)."""
    drafting = speculation.get(backend)
    spec_type = drafting.spec_type if drafting is not None else NONE
    if depth is None:
        depth = _profile_depth(settings, model, profile) if spec_type != NONE else 0
    return {DEPTH_HEADER: str(depth), SPEC_TYPE_HEADER: spec_type}


def _profile_depth(settings: Settings, model: str, profile: str) -> int:
    for each in settings.models:
        if each.name == model:
            for candidate in each.profiles:
                if candidate.name == profile:
                    return each.profile_depth(candidate)
    return 0

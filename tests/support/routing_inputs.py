"""What the routing policies' tests feed them: a request's features, and a random source whose
draws the test decides."""

from __future__ import annotations

import random

from proxy.routing.features import ContentKind, RequestFeatures


def feat(
    tokens: int = 500,
    kind: ContentKind = "prose",
    *,
    agentic: bool = False,
    pin: str | None = None,
    max_tokens: int | None = None,
) -> RequestFeatures:
    return RequestFeatures(
        api="chat",
        model="mtp-demo",
        prompt_chars=int(tokens * 3.5),
        est_prompt_tokens=tokens,
        kind=kind,
        max_tokens=max_tokens,
        stream=True,
        session_key="s1",
        has_tools=agentic,
        pinned_profile=pin,
        agentic=agentic,
    )


class Draws(random.Random):
    """random() returns fixed values in turn (exploration gate); gauss stays seeded."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self._values = list(values)

    def random(self) -> float:
        return self._values.pop(0) if self._values else 0.99

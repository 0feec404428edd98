"""A request class: context-length bucket x content kind, the unit routing learns per.

Statistics, telemetry and the policy all speak of classes, so the class is its own module.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

from proxy.config.routing import RoutingSettings
from proxy.routing.features import ContentKind, RequestFeatures


@dataclass(frozen=True, slots=True, order=True)
class RequestClass:
    bucket: str
    kind: ContentKind

    @property
    def label(self) -> str:
        return f"{self.bucket}/{self.kind}"


def _fmt_tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def bucket_labels(bounds: list[int]) -> list[str]:
    """[4096, 16384] -> ['<4k', '4k-16k', '16k+']."""
    return list(_labels(tuple(bounds)))


@functools.lru_cache(maxsize=16)
def _labels(bounds: tuple[int, ...]) -> tuple[str, ...]:
    labels = [f"<{_fmt_tokens(bounds[0])}"]
    labels += [f"{_fmt_tokens(a)}-{_fmt_tokens(b)}" for a, b in itertools.pairwise(bounds)]
    labels.append(f"{_fmt_tokens(bounds[-1])}+")
    return tuple(labels)


def bucket_contexts(bounds: list[int]) -> dict[str, float]:
    """A representative context per bucket label: the middle of its bounds; the last, open
    bucket at 1.5 times its lower bound ([4096, 16384] -> '<4k' 2048, '4k-16k' 10240, '16k+'
    24576)."""
    edges = [0, *bounds]
    middles = [(a + b) / 2 for a, b in itertools.pairwise(edges)] + [1.5 * bounds[-1]]
    return dict(zip(bucket_labels(bounds), middles, strict=True))


def classify_tokens(tokens: int, kind: ContentKind, settings: RoutingSettings) -> RequestClass:
    bounds = settings.context_buckets
    return RequestClass(_labels(tuple(bounds))[bisect.bisect_right(bounds, tokens)], kind)


def classify(features: RequestFeatures, settings: RoutingSettings) -> RequestClass:
    return classify_tokens(features.est_prompt_tokens, features.kind, settings)


def load_level(decoding: float, settings: RoutingSettings) -> int:
    """The load level of a request decoding beside others (``decoding`` counts it too): the
    largest of ``concurrency_levels`` not above it, so [1, 2, 4] gives 1, 2 (2-3) or 4 (4+)."""
    levels = settings.concurrency_levels
    return levels[max(bisect.bisect_right(levels, round(decoding)) - 1, 0)]


def neighbours(cls: RequestClass, settings: RoutingSettings) -> list[RequestClass]:
    """The classes closest to ``cls``: the other content kind in its bucket, then the same kind
    in the buckets on either side (where estimates are borrowed from while a class is cold)."""
    labels = bucket_labels(settings.context_buckets)
    i = labels.index(cls.bucket)
    other: ContentKind = "prose" if cls.kind == "code" else "code"
    out = [RequestClass(cls.bucket, other)]
    out += [RequestClass(labels[j], cls.kind) for j in (i - 1, i + 1) if 0 <= j < len(labels)]
    return out

"""Request classes in words, for people: "16k-32k/code" is "code, 16-32k tokens".

The router's labels (``proxy.routing.classes``) stay the keys of every file tune writes; these
words are what a summary line or a chart says beside them. A cell measured while others decoded
on the same process carries the load level as ``@N`` (the router's own notation): "2-3 decoding
at once".
"""

from __future__ import annotations

import re

_K = re.compile(r"^(\d+)k$")


def split_level(label: str) -> tuple[str, int]:
    """'<4k/prose@2' -> ('<4k/prose', 2); a label without a level is measured alone (1)."""
    base, at, level = label.partition("@")
    return base, int(level) if at and level.isdigit() else 1


def with_level(label: str, level: int) -> str:
    """The label of a cell at a load level: alone keeps the class's own label."""
    return label if level <= 1 else f"{label}@{level}"


def bucket_words(bucket: str) -> str:
    """'<4k' -> 'under 4k tokens', '4k-16k' -> '4-16k tokens', '64k+' -> '64k+ tokens'."""
    if bucket.startswith("<"):
        return f"under {bucket[1:]} tokens"
    if bucket.endswith("+"):
        return f"{bucket} tokens"
    lo, _, hi = bucket.partition("-")
    if _K.match(lo) and _K.match(hi):
        lo = lo[:-1]  # "16k-32k" reads "16-32k"
    return f"{lo}-{hi} tokens"


def level_words(level: int, levels: list[int]) -> str:
    """How many requests decoded together at a load level: 2 -> '2-3 decoding at once'."""
    later = [n for n in levels if n > level]
    if not later:
        return f"{level}+ decoding at once"
    top = later[0] - 1
    return f"{level} decoding at once" if top == level else f"{level}-{top} decoding at once"


def class_words(label: str, levels: list[int] | None = None) -> str:
    """'16k-32k/code' -> 'code, 16-32k tokens'; '<4k/prose@2' -> 'prose, under 4k tokens,
    2-3 decoding at once' (with the routing's concurrency levels)."""
    base, level = split_level(label)
    bucket, _, kind = base.partition("/")
    words = f"{kind or 'any'}, {bucket_words(bucket)}"
    if level > 1:
        words += ", " + level_words(level, levels or [1, 2, 4])
    return words


def file_part(label: str) -> str:
    """A class label as part of a file name, keeping what tells classes apart:
    '64k+/code' -> '64k+-code', '<4k/prose' -> 'lt4k-prose', '<4k/prose@2' -> 'lt4k-prose-at2'."""
    text = label.replace("<", "lt").replace("@", "-at").replace("/", "-")
    return re.sub(r"[^A-Za-z0-9+.-]+", "-", text).strip("-")


def class_order(label: str) -> tuple[int, int, str]:
    """Short contexts first, then by load level, code before prose."""
    base, level = split_level(label)
    bucket, _, kind = base.partition("/")
    if bucket.startswith("<"):
        return (0, level, kind)
    digits = "".join(ch for ch in bucket.split("-")[0] if ch.isdigit())
    return (int(digits or 0) + 1, level, kind)

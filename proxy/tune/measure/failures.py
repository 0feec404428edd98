"""Requests that failed, counted per request class and reason, and classes given up on.

A failure is not a line on the terminal each: the summary prints one table (class x reason ->
count, with one example). A class whose every request failed in its first repeat is not tried
again in the later ones: the same impossible request would fail the same way (a prompt over the
server's context, say), and a run of 576 requests once spent 490 of them on that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from proxy.tune.report.labels import class_words

CONTEXT = "prompt over the server's context"
TIMEOUT = "timed out"
CONNECTION = "connection failed"
NO_OUTPUT = "no output tokens"
SKIPPED = "not retried: every request of its class failed in its first repeat"


def reason_of(status: int | None, detail: str) -> str:
    """A failure's reason in words, from the HTTP status and the answer's text."""
    text = detail.lower()
    if "exceed_context_size" in text or "context size" in text or "context length" in text:
        return CONTEXT
    if "no output tokens" in text:
        return NO_OUTPUT
    if status is None:
        return detail[:60] or "failed"
    if status == 429:
        return "HTTP 429 (the service's queue is full)"
    return f"HTTP {status}"


@dataclass
class Failures:
    """What failed, by (class, reason); which classes are given up."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    _tried: dict[str, set[int]] = field(default_factory=dict)  # class -> repeats attempted
    _answered: set[str] = field(default_factory=set)  # classes with at least one answer

    def attempt(self, label: str, repeat: int) -> None:
        self._tried.setdefault(label, set()).add(repeat)

    def answered(self, label: str) -> None:
        self._answered.add(label)

    def add(self, label: str, reason: str, example: str) -> bool:
        """Count a failure; True when it is the first of its class and reason."""
        key = (label, reason)
        self.counts[key] += 1
        first = key not in self.examples
        self.examples.setdefault(key, example[:200])
        return first

    def given_up(self, label: str, repeat: int) -> bool:
        """Whether a request of ``label`` in ``repeat`` is not worth sending: nothing of its
        class has answered yet, and an earlier repeat was tried."""
        if label in self._answered:
            return False
        return any(r < repeat for r in self._tried.get(label, ()))

    def skip(self, label: str) -> None:
        self.counts[(label, SKIPPED)] += 1

    @property
    def total(self) -> int:
        return sum(n for (_, reason), n in self.counts.items() if reason != SKIPPED)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "class": label,
                "class_words": class_words(label),
                "reason": reason,
                "count": count,
                "example": self.examples.get((label, reason)),
            }
            for (label, reason), count in sorted(self.counts.items())
        ]

    def table(self) -> str:
        """The summary's failure table: one line per class and reason."""
        rows = self.rows()
        if not rows:
            return ""
        width = max(len(r["class_words"]) for r in rows)
        lines = [f"{'class':<{width}}  {'requests':>8}  reason", "-" * (width + 30)]
        lines += [f"{r['class_words']:<{width}}  {r['count']:>8}  {r['reason']}" for r in rows]
        return "\n".join(lines)

"""What the live page (/ui/) shows of the requests: the last finished ones, and decode speed and
acceptance per depth over the last minutes.

Both are written by the deferred bookkeeping (proxy.observability.bookkeeping), after the answer
went out, never on a request's own path: one tuple appended to a bounded deque (O(1), the oldest
drops out) and four numbers added to the current chart step. They are turned into JSON only when an
admin endpoint is read, so a proxy nobody watches pays a few hundred nanoseconds per request for
them.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from proxy.routing.router import Route
    from proxy.routing.telemetry import Observation
    from proxy.routing.views import BackendView


class Finished(NamedTuple):
    """One finished request (a tuple: one allocation, fields shared with the objects it came
    from). ``depth`` is the depth it ran at on one process (the proxy's, or the client's own
    where it set one); None on a pool (its profile is the depth, resolved when read) or when
    the client's own value was no depth."""

    seq: int
    at: float  # unix time the answer ended
    request_id: str
    api: str
    model: str
    status: int
    duration_s: float
    stream: bool = False
    backend: str | None = None
    session: str | None = None
    request_class: str | None = None
    profile: str | None = None
    depth: int | None = None
    client_depth: bool = False  # the client set speculative.n_max itself
    reason: str | None = None
    detail: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    decode_tok_s: float | None = None
    ttft_s: float | None = None
    error: str | None = None
    level: int | None = None
    """The load level it was routed at (1 alone, 2, 4; 0 on a pool: across loads)."""
    others: int | None = None
    """The other requests on its backend when it was routed (what made a level above 1)."""
    sent_model: str | None = None
    """The model name the client sent, where it is not the served model's (an alias)."""


SESSION_CHARS = 16
"""Of a session key shown: a derived key (a hash) whole, a client's name mostly."""


@dataclass(slots=True)
class _Step:
    """One chart step: per (model, profile, load level) [requests timed, sum of their decode
    tok/s, tokens drafted, tokens accepted]. Per load level: a depth measured beside others is
    never drawn as one line with the same depth measured alone."""

    start: int
    cells: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)


class RecentRequests:
    """The last ``capacity`` finished requests, the last one of each backend, and the chart."""

    def __init__(
        self, capacity: int = 500, window_s: int = 900, step_s: int = 10, *, clock: Any = None
    ) -> None:
        self._rows: deque[Finished] = deque(maxlen=capacity)
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.last_of_backend: dict[str, Finished] = {}
        self.step_s = step_s
        self.window_s = window_s
        self._steps: deque[_Step] = deque(maxlen=max(1, window_s // step_s))
        self._clock = clock or time.time

    @property
    def capacity(self) -> int:
        return self._rows.maxlen or 0

    def record(
        self,
        request_id: str,
        api: str,
        model: str,
        status: int,
        elapsed: float,
        stream: bool,
        route: Route[BackendView] | None,
        observation: Observation | None,
        *,
        session_key: str | None = None,
        own_depth: bool = False,
        client_depth: int | None = None,
        output_tokens: int | None = None,
        error: str | None = None,
        sent_model: str | None = None,
    ) -> None:
        """Keep one finished request: routed (``route``) and measured (``observation``) or
        not; ``output_tokens`` when it was not measured. ``own_depth``: the client set its
        depth, ``client_depth`` (None: not a depth)."""
        seq, at = next(self._seq), self._clock()
        session = None if session_key is None else session_key[:SESSION_CHARS]
        sent = sent_model if sent_model != model else None
        if route is None:
            fields = (seq, at, request_id, api, model, status, elapsed, stream)
            self.add(Finished(*fields, session=session, error=error, sent_model=sent))
            return
        o = observation
        self.add(
            Finished(
                seq,
                at,
                request_id,
                api,
                model,
                status,
                elapsed,
                stream,
                route.backend.name,
                session,
                route.class_label,
                route.profile,
                client_depth if own_depth else route.depth,
                own_depth,
                route.reason,
                route.detail,
                o.context_tokens if o else None,
                o.cached_tokens if o else None,
                o.output_tokens if o else output_tokens,
                o.draft_n if o else None,
                o.draft_n_accepted if o else None,
                o.decode_tok_s if o else None,
                o.ttft_s if o else None,
                error,
                route.level,
                route.in_flight,
                sent,
            )
        )

    def add(self, row: Finished) -> None:
        """Keep one finished request."""
        self._rows.append(row)
        self.last_seq = row.seq
        if row.backend is not None:
            self.last_of_backend[row.backend] = row
        if row.profile is not None and not row.client_depth and row.status == 200:
            self._chart(row, row.profile)

    def _chart(self, row: Finished, profile: str) -> None:
        start = int(row.at) // self.step_s * self.step_s
        steps = self._steps
        if not steps or steps[-1].start != start:
            steps.append(_Step(start))
        cells = steps[-1].cells
        key = (row.model, profile, row.level or 0)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = [0.0, 0.0, 0.0, 0.0]
        if row.decode_tok_s:
            cell[0] += 1.0
            cell[1] += row.decode_tok_s
        if row.drafted and row.accepted is not None:
            cell[2] += row.drafted
            cell[3] += row.accepted

    def after(self, seq: int, limit: int) -> list[Finished]:
        """The requests after ``seq`` (the oldest first), at most the ``limit`` newest."""
        newer = [row for row in reversed(self._rows) if row.seq > seq]
        return newer[:limit][::-1]

    def forget_backends(self, keep: set[str]) -> None:
        """Drop the last request of backends that are gone (a reload removed them)."""
        for name in [n for n in self.last_of_backend if n not in keep]:
            del self.last_of_backend[name]

    def chart(self) -> dict[str, Any]:
        """Per (model, profile, load level: 0 on a pool), the points of the window: the step's
        start, the mean decode tok/s of its requests and the token-weighted acceptance (None
        where none drafted)."""
        since = self._clock() - self.window_s
        lines: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for step in self._steps:
            if step.start < since:
                continue
            for key, (timed, speed, drafted, accepted) in step.cells.items():
                lines.setdefault(key, []).append(
                    {
                        "at": step.start,
                        "requests": int(timed),
                        "decode_tok_s": round(speed / timed, 2) if timed else None,
                        "acceptance": round(accepted / drafted, 4) if drafted else None,
                    }
                )
        return {
            "step_s": self.step_s,
            "window_s": self.window_s,
            "lines": [
                {"model": model, "profile": profile, "level": level, "points": points}
                for (model, profile, level), points in sorted(lines.items())
            ],
        }


def as_json(row: Finished, depth_of: dict[str, dict[str, int]]) -> dict[str, Any]:
    """A finished request as the admin API shows it; a pool's depth is its profile's."""
    data = row._asdict()
    data["duration_s"] = round(row.duration_s, 4)
    if row.depth is None and not row.client_depth and row.profile is not None:
        data["depth"] = depth_of.get(row.model, {}).get(row.profile)
    return data

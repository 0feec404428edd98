"""The trace format: a workload file of requests, JSON Lines, one request per line.

    {"at": <seconds since start>, "session": <string or null>,
     "path": "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/messages",
     "body": {<the request body, as a client sends it>}}

``mtp-proxy tune --workload FILE`` replays such a file, and so does the routing benchmark of the
repository. ``at`` is in trace seconds (the benchmark scales it to the simulator's clock). Turns
of one session are sent in order, each no earlier than its ``at`` and after the previous turn
finished; requests without a session are sent at their ``at``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config.files import TRACE_LIMIT, read_local_file

PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
"""The paths a trace request may take: the four generation APIs' /v1 paths."""


class TraceError(ValueError):
    """A trace line is not a request record; the message names the line."""


@dataclass(frozen=True)
class TraceRequest:
    index: int  # position in the trace (requests are numbered in file order)
    at: float
    session: str | None
    path: str
    body: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "session": self.session, "path": self.path, "body": self.body}


def parse_line(index: int, line: str) -> TraceRequest:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"line {index + 1}: not JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"line {index + 1}: nested too deeply to read") from None
    if not isinstance(data, dict):
        raise TraceError(f"line {index + 1}: expected an object")
    at, session, path, body = (data.get(k) for k in ("at", "session", "path", "body"))
    if isinstance(at, bool) or not isinstance(at, int | float) or at < 0:
        raise TraceError(f"line {index + 1}: 'at' must be a number >= 0")
    if session is not None and not isinstance(session, str):
        raise TraceError(f"line {index + 1}: 'session' must be a string or null")
    if path not in PATHS:
        raise TraceError(f"line {index + 1}: 'path' must be one of {', '.join(PATHS)}")
    if not isinstance(body, dict):
        raise TraceError(f"line {index + 1}: 'body' must be an object")
    return TraceRequest(index, float(at), session, path, body)


def read_trace(path: Path) -> list[TraceRequest]:
    """The trace's requests; OSError if it is not a regular file of a sensible size (a FIFO, a
    device: proxy.config.files), TraceError for a line that is not a request."""
    try:
        text = read_local_file(path, TRACE_LIMIT).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    return [parse_line(i, line) for i, line in enumerate(lines)]


def write_trace(path: Path, requests: Iterable[TraceRequest]) -> int:
    """Write the trace (one compact JSON object per line); returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with path.open("w", encoding="utf-8") as f:
        for line in dump_lines(requests):
            f.write(line)
            size += len(line.encode())
    return size


def dump_lines(requests: Iterable[TraceRequest]) -> Iterator[str]:
    for r in requests:
        yield json.dumps(r.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"

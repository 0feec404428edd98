"""`mtp-proxy status`: backends, routing mix and learned table of a running proxy, as tables."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


def print_status(url: str, admin_key: str | None) -> int:
    key = admin_key or os.environ.get("MTP_PROXY_ADMIN_KEY")
    try:
        backends = _get(url, "/admin/backends", key)["backends"]
        routing = _get(url, "/admin/routing", key)
    except (OSError, ValueError, KeyError) as exc:
        print(f"mtp-proxy status: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    print(render_status(backends, routing))
    return 0


def render_status(backends: list[dict[str, Any]], routing: dict[str, Any]) -> str:
    sections = [
        "Backends",
        _table(
            ["backend", "profile", "state", "pid", "restarts", "in-flight", "uptime"],
            [
                [
                    b.get("name"),
                    b.get("profile"),
                    b.get("state"),
                    b.get("pid"),
                    b.get("restarts"),
                    b.get("in_flight"),
                    _seconds(b.get("uptime_s")),
                ]
                for b in backends
            ],
        ),
        "",
        "Routing mix (decisions since start)",
        _table(
            ["model", "profile", "reason", "requests"],
            [[m["model"], m["profile"], m["reason"], m["count"]] for m in routing.get("mix", [])],
        ),
        "",
        "Learned table",
        _table(
            ["model", "class", "profile", "acceptance", "decode tok/s", "samples", "trusted"],
            [
                [
                    r["model"],
                    r["request_class"],
                    r["profile"],
                    _ratio(r.get("acceptance")),
                    _number(r.get("decode_tok_s")),
                    _number(r.get("samples")),
                    "yes" if r.get("trusted") else "no",
                ]
                for r in routing.get("learned", [])
            ],
        ),
    ]
    return "\n".join(sections)


def _get(url: str, path: str, key: str | None) -> Any:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url}")
    request = urllib.request.Request(url.rstrip("/") + path)  # noqa: S310 - checked above
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - admin URL
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{path} answered {exc.code} (admin key set?)") from None


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not rows:
        lines.append("(none yet)")
    return "\n".join(lines)


def _ratio(value: object) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else "-"


def _number(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _seconds(value: object) -> str:
    return f"{value:.0f}s" if isinstance(value, int | float) else "-"

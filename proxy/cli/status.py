"""`mtp-proxy status`: backends, the depth each process runs now, routing mix and learned table
of a running proxy, as tables; `--watch` redraws them every few seconds.

For the box without Grafana: it reads the admin endpoints (/admin/backends, /admin/depths,
/admin/routing) of a running proxy and prints what an operator asks first: is every backend up
and what does it draft with (its speculative type), which depth does each process run and why,
where does the traffic go and why, and what has the proxy learned about each profile. The live
page (/ui/) shows the same, and the requests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from typing import Any

from supervisor.urls import shown

_TIMEOUT_S = 5.0


class StatusError(Exception):
    """The proxy could not be read; the message says why in an operator's words."""


_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def print_status(url: str, admin_key: str | None, watch: float | None = None) -> int:
    """Print the tables once (exit 1 if the proxy cannot be read), or with ``watch`` redraw
    them every ``watch`` seconds until Ctrl-C, saying what went wrong in their place meanwhile
    (a proxy restarting comes back)."""
    key = admin_key or os.environ.get("MTP_PROXY_ADMIN_KEY")
    if watch is None:
        try:
            print(shown(read_status(url, key)))
        except StatusError as exc:
            print(shown(f"mtp-proxy status: {exc}"), file=sys.stderr)
            return 1
        return 0
    clear = _CLEAR if sys.stdout.isatty() else ""
    try:
        while True:
            try:
                frame = read_status(url, key)
            except StatusError as exc:
                frame = f"mtp-proxy status: {exc}"
            stamp = time.strftime("%H:%M:%S")
            frame = shown(frame)  # credentials in a URL are masked wherever one is shown
            print(f"{clear}{frame}\n\n(every {watch:g} s, {stamp}; Ctrl-C to stop)", flush=True)
            time.sleep(watch)
    except KeyboardInterrupt:
        return 0


def watch_seconds(text: str) -> float:
    """`--watch`'s value: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def read_status(url: str, key: str | None) -> str:
    """The tables, as text; StatusError when the proxy cannot be read."""
    try:
        backends = _get(url, "/admin/backends", key)["backends"]
        now = _get(url, "/admin/depths", key)
        depths, warnings = now["backends"], now.get("warnings") or []
        routing = _get(url, "/admin/routing", key)
    except (KeyError, TypeError, AttributeError):
        raise StatusError(f"{url} does not answer like mtp-proxy") from None
    return render_status(url, backends, routing, depths, warnings)


def render_status(
    url: str,
    backends: list[dict[str, Any]],
    routing: dict[str, Any],
    depths: list[dict[str, Any]] | None = None,
    warnings: Sequence[str] = (),
) -> str:
    ready = sum(1 for b in backends if b.get("state") == "ready")
    summary = (
        f"mtp-proxy at {url}: {ready}/{len(backends)} backends ready, "
        f"{routing.get('sessions', 0)} sessions tracked, learned state: {routing.get('state')}"
    )
    sections = [
        summary,
        *(f"warning: {warning}" for warning in warnings),
        "",
        "Backends",
        _backends_table(backends),
        "",
        "Depth per process (now, and why)",
        _depths_table(depths or []),
        "",
        "Routing mix (decisions since start)",
        _mix_table(routing.get("mix", [])),
        "",
        "Learned table (per request class and profile)",
        _learned_table(routing.get("learned", [])),
    ]
    calibration = routing.get("calibration") or {}
    if calibration:
        sections += [
            "",
            "Start-up calibration (decode tok/s per request; cold rule per load level)",
            _calibration_table(calibration),
        ]
    collapse = routing.get("collapse") or {}
    if collapse:
        sections += ["", "Acceptance collapse guard", _collapse_table(collapse)]
    return "\n".join(sections)


_BACKEND_COLUMNS = (
    "backend", "profile", "spec type", "state", "draft control", "late system", "pid",
    "restarts", "in-flight", "uptime", "last error",
)  # fmt: skip


def _backends_table(backends: list[dict[str, Any]]) -> str:
    return _table(
        _BACKEND_COLUMNS,
        [
            [
                b.get("name"),
                b.get("profile"),
                _spec_type(b.get("spec_type"), b.get("draft_model")),
                b.get("state"),
                b.get("draft_control"),
                _late_system(b.get("chat_template")),
                b.get("pid"),
                b.get("restarts"),
                _in_flight(b.get("in_flight"), b.get("slots")),
                _seconds(b.get("uptime_s")),
                _short(b.get("cause") or b.get("last_error"), 60),
            ]
            for b in backends
        ],
    )


def _depths_table(depths: list[dict[str, Any]]) -> str:
    return _table(
        ["backend", "depth now", "why", "busy epoch", "last request"],
        [
            [
                d.get("name"),
                _depth_now(d),
                d.get("why"),
                _epoch(d.get("busy")),
                _last(d.get("last")),
            ]
            for d in depths
        ],
    )


def _depth_now(row: dict[str, Any]) -> str:
    return str(row.get("now") or "-")


def _epoch(busy: object) -> str | None:
    if not isinstance(busy, dict):
        return None
    exploring = ", exploring" if busy.get("exploring") else ""
    return f"{busy.get('profile')} (depth {busy.get('depth')}), {busy.get('left')} left{exploring}"


def _last(last: object) -> str | None:
    if not isinstance(last, dict):
        return None
    at = last.get("at")
    when = f", {_seconds(time.time() - at)} ago" if isinstance(at, float) else ""
    return f"{last.get('profile')} (depth {last.get('depth')}), {last.get('reason')}{when}"


def _mix_table(mix: list[dict[str, Any]]) -> str:
    per_model: Counter[str] = Counter()
    for row in mix:
        per_model[row["model"]] += row["count"]
    return _table(
        ["model", "profile", "reason", "requests", "share"],
        [
            [
                m["model"],
                m["profile"],
                m["reason"],
                m["count"],
                _ratio(m["count"] / per_model[m["model"]] if per_model[m["model"]] else None),
            ]
            for m in mix
        ],
    )


def _learned_table(learned: list[dict[str, Any]]) -> str:
    return _table(
        ["model", "class", "load", "profile", "acceptance", "decode tok/s", "samples", "trusted"],
        [
            [
                r["model"],
                r["request_class"],
                r.get("load_level", "-"),
                r["profile"],
                _ratio(r.get("acceptance")),
                _number(r.get("decode_tok_s")),
                r.get("samples"),
                "yes" if r.get("trusted") else "no",
            ]
            for r in learned
        ],
    )


def _calibration_table(calibration: dict[str, Any]) -> str:
    rows = []
    for name, c in sorted(calibration.items()):
        speeds = {(cell["load"], cell["depth"]): cell["tok_s"] for cell in c.get("cells", [])}
        loads = sorted({load for load, _ in speeds})
        depths = sorted({depth for _, depth in speeds})
        measured = "; ".join(
            f"{load} decoding: "
            + ", ".join(f"depth {d} {_number(speeds.get((load, d)))}" for d in depths)
            for load in loads
        )
        levels = c.get("levels", {})
        rules = ", ".join(f"{lv}: {_cold_rule(v)}" for lv, v in sorted(levels.items()))
        rows.append([name, measured, rules, _seconds_short(c.get("backend_s"))])
    return _table(["backend", "measured", "cold rule by level", "cost"], rows)


def _cold_rule(level: dict[str, Any]) -> str:
    """A level's cold rule, and depth 3 against depth 0 by content kind where measured."""
    by_kind = level.get("by_kind") or {}
    gaps = ", ".join(f"{kind} {ratio:.2f}x" for kind, ratio in sorted(by_kind.items()))
    return f"{level.get('cold_role')}" + (f" ({gaps})" if gaps else "")


def _collapse_table(collapse: dict[str, Any]) -> str:
    rows = [
        [
            name,
            "collapsed" if c.get("collapsed") else "ok",
            _ratio(c.get("acceptance")),
            _ratio(c.get("expected")),
            c.get("drafted"),
            c.get("cause") or "-",
        ]
        for name, c in sorted(collapse.items())
    ]
    return _table(["backend", "state", "acceptance", "expected", "drafted", "cause"], rows)


def _seconds_short(value: object) -> str:
    return f"{value:.1f}s" if isinstance(value, int | float) else "-"


def _get(url: str, path: str, key: str | None) -> Any:
    if not url.startswith(("http://", "https://")):
        raise StatusError(f"--url must be an http:// or https:// URL, not {url!r}")
    request = urllib.request.Request(url.rstrip("/") + path)  # noqa: S310 - scheme checked above
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:  # noqa: S310
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise StatusError(_http_problem(url, path, exc.code)) from None
    except urllib.error.URLError as exc:
        raise StatusError(
            f"cannot reach mtp-proxy at {url} ({exc.reason}); is it running?"
        ) from None
    except (OSError, ValueError) as exc:  # timeouts, resets, a body that is not JSON
        raise StatusError(f"no usable answer from {url}{path}: {exc}") from None


def _http_problem(url: str, path: str, code: int) -> str:
    if code == 401:
        return f"{url} refused the admin key: pass --admin-key or set MTP_PROXY_ADMIN_KEY"
    if code == 404:
        return f"{url}{path} answered 404: admin endpoints off (server.admin_key) or no mtp-proxy"
    return f"{url}{path} answered HTTP {code}"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not rows:
        lines.append("(none yet)")
    return "\n".join(lines)


def _spec_type(spec_type: object, draft_model: object) -> str | None:
    """The backend's speculative type, and its draft model's file where it drafts with one."""
    if not isinstance(spec_type, str):
        return None
    return spec_type + (f" ({draft_model})" if isinstance(draft_model, str) else "")


def _late_system(check: object) -> object:
    """The chat-template check's verdict (supervisor.template_check), None until checked."""
    return check.get("late_system") if isinstance(check, dict) else None


def _in_flight(in_flight: object, slots: object) -> str:
    if not isinstance(in_flight, int):
        return "-"
    return f"{in_flight}/{slots}" if isinstance(slots, int) else str(in_flight)


def _ratio(value: object) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else "-"


def _number(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _seconds(value: object) -> str:
    if not isinstance(value, int | float):
        return "-"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _short(value: object, limit: int = 40) -> str | None:
    if not value:
        return None
    text = str(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The start-up banner, on a terminal only: what runs, where to send requests, one request to
try, and how to see what the proxy does. Under systemd (no terminal) the log says it all.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from proxy.config.settings import ModelSettings, Settings
from proxy.ui.routes import link as ui_link
from supervisor.flags import CTX_SIZE, PARALLEL, flag_value
from supervisor.urls import shown

_WIDTH = 11  # the labels' column


def render_banner(
    settings: Settings,
    port: int,
    *,
    version: str,
    config_path: Path | None,
    command: str,
    admin_key: str | None,
) -> str:
    """The banner's lines. `command` is how the user runs mtp-proxy (e.g. .venv/bin/mtp-proxy);
    `admin_key` is shown only when the proxy made it up itself (the demo's)."""
    host = settings.server.host
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
    url = f"http://{shown_host}:{port}"
    source = str(config_path) if config_path else "the embedded demo configuration"
    lines = [f"mtp-proxy {version} on {url} ({source})"]
    for model in settings.models:
        lines += _labelled("runs", what_runs(model))
    lines += _labelled("base URL", [f"{url}/v1 (OpenAI), {url} (Anthropic)"])
    lines += _labelled("try", [_curl(url, settings), *_first_answer(settings)])
    status = f"{command} status --url {url}"
    if admin_key is not None:
        status += f" --admin-key={admin_key}"  # "=": a key may begin with "-"
        lines += _labelled("admin key", [f"{admin_key} (made up for this run)"])
    elif settings.server.admin_key is not None:
        status += " --config FILE" if config_path is None else f" --config {config_path}"
    else:
        status = "set server.admin_key to use mtp-proxy status"
    lines += _labelled(
        "watch",
        [
            f"{status}   (backends, routing mix, what it learned)",
            *_live_page(settings, port, admin_key),
            "the log below: one line per request (which profile, why); metrics: "
            + f"{url}/metrics",
        ],
    )
    return "\n".join(lines)


def _first_answer(settings: Settings) -> list[str]:
    """Why the first answer may take a while: a process serving per-request depths is measured
    before it is ready (proxy.routing.calibrate), and a curl that waits with no word looks hung."""
    if settings.routing.calibrate == "off":
        return []
    if not any(
        model.draft_control != "per-process" and model.start_depth() > 0
        for model in settings.models
    ):
        return []
    kept = settings.routing.learned_file
    where = f"kept in {kept}" if kept else "measured again at each start: no routing.learned_file"
    return [f"(answered once the backend is calibrated: ~25 s at 27B speed, {where})"]


def _live_page(settings: Settings, port: int, made_up_key: str | None) -> list[str]:
    """The live page's link (proxy.ui): a configured admin key is never printed."""
    if not settings.ui.enabled:
        return []
    if made_up_key is None and settings.server.admin_key is None:
        return ["set server.admin_key to see the live page at /ui/"]
    url = ui_link(settings.server.host, port, made_up_key or "ADMIN_KEY")
    return [f"{url}   (live: each request, its depth and why; what each depth earned)"]


def what_runs(model: ModelSettings) -> list[str]:
    """What serves a model, in words (the truth about the demo's simulator included)."""
    profiles = "/".join(p.name for p in model.profiles)
    slots = flag_value(model.args, PARALLEL)
    ctx = flag_value(model.args, CTX_SIZE)
    shape = ", ".join(
        part for part in (f"{slots} slots" if slots else "", f"-c {ctx}" if ctx else "") if part
    )
    if model.backend == "simulator":
        preset = flag_value(model.args, ("--preset",)) or "setup-b"
        return [
            f"{model.name}: a simulated llama-server, no GPU used and no model file: "
            f"{_preset_words(preset, ctx is not None)}"
            + (f", run here with {shape}" if shape else ""),
            f"profiles {profiles} ({model.draft_control})",
        ]
    binary = model.binary or "llama-server"
    parts = []
    if any(p.url is None for p in model.profiles):
        parts.append(f"{binary} on {model.model_path}" + (f" ({shape})" if shape else ""))
    remote = [f"{p.name} at {shown(p.url)}" for p in model.profiles if p.url is not None]
    if remote:  # credentials in a URL are masked wherever one is shown
        parts.append("llama-server running elsewhere: " + ", ".join(remote))
    return [f"{model.name}: {'; '.join(parts)}", f"profiles {profiles} ({model.draft_control})"]


def _preset_words(preset: str, own_context: bool) -> str:
    """The preset's description; without its "-c N" when the run has its own (one context size
    on the line: the one it runs with)."""
    from simulator.presets import load_preset  # the demo's twin; the proxy needs it only here

    try:
        description = load_preset(preset).description
    except (OSError, ValueError):
        return f"simulator preset {preset}"
    if own_context:
        description = re.sub(r",? -c \d+", "", description)
    return f"{description}, simulator preset {preset}"


def _curl(url: str, settings: Settings) -> str:
    body = {
        "model": settings.models[0].name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 32,
    }
    argv = ["curl", "-s", f"{url}/v1/chat/completions", "-H", "Content-Type: application/json"]
    if settings.server.api_keys:
        argv += ["-H", "Authorization: Bearer YOUR_KEY"]
    argv += ["-d", json.dumps(body, separators=(",", ":"))]
    return " ".join(shlex.quote(arg) for arg in argv)


def _labelled(label: str, texts: Sequence[str]) -> list[str]:
    head = f"  {label + ':':<{_WIDTH}}"
    return [head + texts[0], *(" " * len(head) + text for text in texts[1:])]

"""Running `mtp-proxy tune` as a real process in tests, and reading what it leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import tomli_w

TIME_SCALE = 2000.0


def sim_config(
    preset: str,
    ctx: int,
    *,
    time_scale: float = TIME_SCALE,
    profiles: list[dict[str, Any]] | None = None,
    extra_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A config whose model is the simulator (one slot, every session alike: --latent-sigma 0)."""
    return {
        "routing": {"clock_scale": time_scale},
        "supervisor": {"stagger_s": 0.0, "ready_poll_s": 0.02, "stop_timeout_s": 5.0},
        "models": [
            {
                "name": "mtp-demo",
                "backend": "simulator",
                "args": [
                    "--preset",
                    preset,
                    "--time-scale",
                    str(time_scale),
                    "--latent-sigma",
                    "0",
                    "-np",
                    "1",
                    "-c",
                    str(ctx),
                    *extra_args,
                ],
                "profiles": profiles or [{"name": "off"}],
            }
        ],
    }


def write_config(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def tune_argv(config: Path, out: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "proxy.cli",
        "tune",
        "--config",
        str(config),
        "--out",
        str(out),
        *args,
    ]


def run_tune(
    config: Path, out: Path, *args: str, timeout: float = 240.0
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        tune_argv(config, out, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def run_tune_url(
    url: str, admin_key: str, out: Path, *args: str, timeout: float = 900.0
) -> subprocess.CompletedProcess[str]:
    """`mtp-proxy tune --url` against a running proxy."""
    argv = [
        sys.executable, "-m", "proxy.cli", "tune", "--url", url, "--admin-key", admin_key,
        "--out", str(out), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def first_decision(proxy_url: str) -> tuple[str, str]:
    """A short chat through the proxy: the profile that served it and why (its headers)."""
    body = {"messages": [{"role": "user", "content": "Hi! How are you today?"}], "max_tokens": 64}
    request = urllib.request.Request(
        proxy_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.headers["X-MTP-Profile"], response.headers["X-MTP-Route-Reason"]


def results(out: Path) -> list[dict[str, Any]]:
    """The table's rows of results.json."""
    rows: list[dict[str, Any]] = document(out)["rows"]
    return rows


def document(out: Path) -> dict[str, Any]:
    """results.json as a whole: the rows, what was left out and why, failures, the run."""
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def by_class(rows: list[dict[str, Any]], label: str) -> dict[str, dict[str, Any]]:
    """setting name -> row, for one class."""
    return {row["setting_name"]: row for row in rows if row["class"] == label}


def best(rows: list[dict[str, Any]], label: str) -> str:
    cells = by_class(rows, label)
    assert cells, f"class {label} not measured: {sorted({r['class'] for r in rows})}"
    return max(cells, key=lambda name: cells[name]["tok_s"])


def profiles(out: Path) -> list[dict[str, Any]]:
    data = tomllib.loads((out / "profiles.toml").read_text())
    found: list[dict[str, Any]] = data["models"]["profiles"]
    return found

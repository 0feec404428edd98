"""The first five minutes, in-process: the banner's words (the truth about the demo), the
console rendering without empty fields, and an unknown pin refused. On real processes:
tests/proxy/test_cli.py, tests/proxy/test_pinning.py, tests/proxy/test_logs.py."""

from __future__ import annotations

import io
import logging
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from proxy.cli.banner import render_banner, what_runs
from proxy.cli.main import _demo_admin_key, _parser
from proxy.config.settings import Settings, load_settings
from proxy.observability.logs import configure_logging
from proxy.serving.handlers import unknown_pin


def demo() -> Settings:
    return load_settings(None)


def test_the_demo_banner_says_what_runs_in_truth() -> None:
    text = render_banner(
        demo(), 8080, version="0.1.0", config_path=None, command=".venv/bin/mtp-proxy",
        admin_key="k3y-made-up",
    )  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "mtp-proxy 0.1.0 on http://127.0.0.1:8080 (the embedded demo configuration)"
    runs = next(line for line in lines if "runs:" in line)
    # The preset's own description without its -c (one context size on the line: the one it
    # runs with), and how the demo differs from it: 4 slots, -c 131072.
    assert "mtp-demo: a simulated llama-server, no GPU used and no model file" in runs
    assert runs.endswith(
        "Qwen3.6 27B Q4_K_M, RTX 3090 (published Setup B), simulator preset "
        "setup-b, run here with 4 slots, -c 131072"
    )
    assert "http://127.0.0.1:8080/v1 (OpenAI), http://127.0.0.1:8080 (Anthropic)" in text
    curl = next(line for line in lines if "try:" in line)
    assert "curl -s http://127.0.0.1:8080/v1/chat/completions" in curl
    assert '"model":"mtp-demo"' in curl
    # The first answer waits for the start-up calibration (~25 s on the demo): said, not a hang.
    after_curl = lines[lines.index(curl) + 1]
    assert "answered once the backend is calibrated" in after_curl
    assert "measured again at each start: no routing.learned_file" in after_curl
    assert ".venv/bin/mtp-proxy status --url http://127.0.0.1:8080 --admin-key=k3y-made-up" in text
    # The live page with the key made up for this run: the link opens it as it is.
    assert "http://127.0.0.1:8080/ui/#key=k3y-made-up   (live: " in text


def test_the_banners_status_command_parses_whatever_the_key_begins_with() -> None:
    # A CI run drew a made-up key beginning with "-": `--admin-key -x...` read it as a flag.
    text = render_banner(
        demo(), 8080, version="0.1.0", config_path=None, command="mtp-proxy", admin_key="-k3y"
    )
    line = next(line for line in text.splitlines() if "mtp-proxy status" in line)
    words = shlex.split(line.split("mtp-proxy ", 1)[1].split("   (")[0])
    assert _parser().parse_args(words).admin_key == "-k3y"


def test_made_up_keys_never_begin_with_a_dash(tmp_path: Path) -> None:
    settings = demo()
    keys = [_demo_admin_key(demo(), None) for _ in range(200)]
    assert all(key and re.fullmatch(r"[0-9a-f]{32}", key) for key in keys), keys
    assert _demo_admin_key(settings, tmp_path / "config.toml") is None  # a file brings its own


def test_a_configured_box_points_status_at_its_config(tmp_path: Path) -> None:
    settings = Settings(
        server={"admin_key": "secret-of-the-file", "host": "0.0.0.0", "api_keys": ["sk-1"]},
        models=[
            {
                "name": "qwen",
                "binary": "/opt/mtp-proxy/llama-server/bin/llama-server",
                "model_path": "/srv/models/q.gguf",
                "args": ["-c", "100000", "-np", "1"],
                "profiles": [{"name": "off"}],
            }
        ],
    )
    config = tmp_path / "config.toml"
    text = render_banner(
        settings, 9000, version="1", config_path=config, command="mtp-proxy", admin_key=None
    )
    assert "secret-of-the-file" not in text
    assert "calibrated" not in text  # a model that never drafts is not measured
    assert "http://127.0.0.1:9000/ui/#key=ADMIN_KEY" in text  # the key itself: never printed
    assert f"mtp-proxy status --url http://127.0.0.1:9000 --config {config}" in text
    assert "Authorization: Bearer YOUR_KEY" in text
    assert what_runs(settings.models[0])[0] == (
        "qwen: /opt/mtp-proxy/llama-server/bin/llama-server on /srv/models/q.gguf "
        "(1 slots, -c 100000)"
    )


def test_without_an_admin_key_the_banner_says_how_to_see_the_live_page() -> None:
    settings = Settings(models=demo().models)
    text = render_banner(
        settings, 8080, version="1", config_path=Path("c.toml"), command="mtp-proxy",
        admin_key=None,
    )  # fmt: skip
    assert "set server.admin_key to see the live page at /ui/" in text
    assert "/ui/#key=" not in text


def test_the_banner_says_nothing_of_a_calibration_turned_off() -> None:
    settings = Settings(models=demo().models, routing={"calibrate": "off"})
    text = render_banner(
        settings, 8080, version="1", config_path=Path("c.toml"), command="mtp-proxy",
        admin_key=None,
    )  # fmt: skip
    assert "calibrated" not in text


@pytest.fixture
def console() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    before, level = root.handlers[:], root.level
    out = io.StringIO()
    configure_logging("info", "console", stream=out)
    yield out
    for handler in [h for h in root.handlers if h not in before]:
        root.removeHandler(handler)
    root.setLevel(level)
    structlog.reset_defaults()


def test_the_console_leaves_out_empty_fields(console: io.StringIO) -> None:
    structlog.get_logger("proxy.request").info(
        "request", path="/v1/models", status=200, profile=None, acceptance=None
    )
    line = console.getvalue()
    assert "path=/v1/models" in line and "status=200" in line
    assert "None" not in line and "profile=" not in line


def test_an_unknown_pin_names_the_known_profiles() -> None:
    settings = demo()
    problem = unknown_pin(settings, "mtp-demo", {"X-MTP-Profile": "turbo"})
    assert problem == (
        "unknown profile 'turbo' in the X-MTP-Profile header: model mtp-demo has the profiles "
        "off, min, max"
    )
    for known in ("off", "MIN", "max"):
        assert unknown_pin(settings, "mtp-demo", {"X-MTP-Profile": known}) is None
    assert unknown_pin(settings, "mtp-demo", {}) is None

"""A remote backend's URL (a profile's `url`): credentials in its userinfo are masked wherever
the URL is shown (check-config, /admin/backends, `mtp-proxy status`, the log, the banner), and a
query or a fragment, which the proxy's paths would land after (the backend never looked ready),
is refused when the configuration is read, with a message that does not repeat it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from proxy.cli.banner import render_banner
from proxy.config.settings import Settings
from proxy.observability.logs import Redactor
from tests.support.cli import run_cli
from tests.support.harness import ADMIN_KEY, proxy_config, running_proxy, wait_all_ready
from tests.support.misbehaving_backend import running_backend

SECRET = "PW-s3cret-42"


@pytest.fixture(scope="module")
def backend_url() -> Iterator[str]:
    with running_backend("ok") as url:
        yield url


def with_password(url: str) -> str:
    return url.replace("http://", f"http://someone:{SECRET}@")


def masked(url: str) -> str:
    return url.replace("http://", "http://someone:***@")


def remote_config(url: str) -> dict[str, Any]:
    profiles = [{"name": "off", "url": url}]
    config = proxy_config([{"name": "remote", "backend": "llama-server", "profiles": profiles}])
    config["log"]["level"] = "debug"  # the most the log ever says
    return config


def write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(config))
    return path


def test_check_config_shows_the_url_with_its_password_masked(
    tmp_path: Path, backend_url: str
) -> None:
    done = run_cli("check-config", str(write(tmp_path, remote_config(with_password(backend_url)))))
    assert done.returncode == 0, done.stderr
    assert f"remote/off: {masked(backend_url)}" in done.stdout
    assert SECRET not in done.stdout + done.stderr


def test_admin_status_and_the_log_show_it_masked(tmp_path: Path, backend_url: str) -> None:
    config = remote_config(with_password(backend_url))
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy, {"remote": 1})  # the password reaches the backend, not the eyes
        status, answer = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        shown = run_cli("status", "--url", proxy.url, "--admin-key", ADMIN_KEY)
        # urllib sends no userinfo: such a --url is not reached, and the error shows it masked.
        unreached = run_cli("status", "--url", with_password(proxy.url), "--admin-key", ADMIN_KEY)
    assert status == 200
    (row,) = answer["backends"]
    assert row["url"] == masked(backend_url) and row["state"] == "ready"
    assert shown.returncode == 0 and "remote/off" in shown.stdout, shown.stderr
    assert SECRET not in shown.stdout + shown.stderr
    assert unreached.returncode == 1 and masked(proxy.url) in unreached.stderr
    assert SECRET not in unreached.stdout + unreached.stderr
    assert SECRET not in proxy.log_path.read_text()


def test_the_log_masks_any_url_with_credentials() -> None:
    redact = Redactor()
    event = {
        "event": "upstream_unavailable",
        "error": f"GET {with_password('http://10.0.0.2:8080')}/health failed",
        "urls": [with_password("http://h.example")],
    }
    line = redact(None, "warning", event)
    assert line["error"] == f"GET {masked('http://10.0.0.2:8080')}/health failed"
    assert line["urls"] == ["http://someone:***@h.example"]


def test_the_banner_shows_the_url_masked(backend_url: str) -> None:
    settings = Settings(**remote_config(with_password(backend_url)))
    text = render_banner(
        settings, 8080, version="0", config_path=None, command="mtp-proxy", admin_key=None
    )
    assert f"off at {masked(backend_url)}" in text and SECRET not in text


@pytest.mark.parametrize(
    ("suffix", "part"),
    [("/?token=" + SECRET, "a query (?...)"), ("/#" + SECRET, "a fragment (#...)")],
)
@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_url_with_a_query_or_fragment_is_refused(
    tmp_path: Path, backend_url: str, suffix: str, part: str, command: str
) -> None:
    path = write(tmp_path, remote_config(backend_url + suffix))
    args = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    done = run_cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert f"models.0.profiles.0: Value error, url must be a base URL, without {part}" in (
        done.stderr
    )
    assert SECRET not in done.stdout + done.stderr

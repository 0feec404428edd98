"""Settings: TOML loading, environment overrides, readable errors, check-config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config.settings import ConfigError, load_settings
from proxy.plans.plan import backend_specs, plans_of
from proxy.serving.model_names import ModelCatalog

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_embedded_default_is_one_simulated_process_with_per_request_depths() -> None:
    settings = load_settings(None)
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    plan = plans_of(settings)["mtp-demo"]
    assert (plan.shape, dict(plan.depths)) == ("one-process", {"off": 0, "min": 2, "max": 3})
    (spec,) = backend_specs(settings)
    assert spec.name == "mtp-demo/one-process"
    argv = list(spec.argv)
    assert argv[1:3] == ["-m", "simulator"]
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"  # the deepest profile's
    assert argv.count("--metrics") == 1


def test_the_pool_stays_one_process_per_profile(tmp_path: Path) -> None:
    text = (ROOT / "proxy" / "config" / "default.toml").read_text()
    path = tmp_path / "pool.toml"
    path.write_text(text.replace('draft_control = "per-request"', 'draft_control = "per-process"'))
    specs = backend_specs(load_settings(path))
    assert [s.name for s in specs] == ["mtp-demo/off", "mtp-demo/min", "mtp-demo/max"]
    off, low, high = (list(s.argv) for s in specs)
    assert "--spec-type" not in off
    assert low[low.index("--spec-draft-n-max") + 1] == "2"
    assert low[low.index("--spec-draft-n-min") + 1] == "1"
    assert high[high.index("--spec-draft-n-max") + 1] == "3"
    assert all(argv.count("--metrics") == 1 for argv in (off, low, high))


def test_documented_config_is_the_embedded_default() -> None:
    # config.toml says it is the embedded default: a name one accepts, the other must too.
    assert load_settings(ROOT / "config.toml") == load_settings(None)


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTP_PROXY_SERVER__PORT", "9123")
    monkeypatch.setenv("MTP_PROXY_SERVER__ADMIN_KEY", "s3cret")
    settings = load_settings(ROOT / "config.toml")
    assert settings.server.port == 9123
    assert settings.server.admin_key is not None
    assert settings.server.admin_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


def test_missing_file_is_an_error_not_silent_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path / "nope.toml")
    assert caught.value.problems == ["file not found"]


def test_every_problem_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[server]\nport = "high"\nbogus = 1\n'
        '[[models]]\nname = "m"\nbackend = "simulator"\n'
        '[[models.profiles]]\nname = "a"\ndraft_n_max = 3\n'
        '[[models]]\nname = "n"\nbackend = "simulator"\n'
        '[[models.profiles]]\nname = "b"\n[[models.profiles]]\nname = "b"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    text = caught.value.render()
    assert "server.port" in text
    assert "server.bogus" in text
    assert "models.0.profiles.0: Value error, speculation is off but n_max is set" in text
    assert "models.1.profiles: Value error, duplicate profile names: b" in text


def test_check_config_prints_each_backend_command_line() -> None:
    result = run_cli("check-config", str(ROOT / "config.toml"))
    assert result.returncode == 0, result.stderr
    assert "model mtp-demo: 3 profile(s)" in result.stdout
    assert "any other model name: mtp-demo" in result.stdout
    line = next(line for line in result.stdout.splitlines() if "mtp-demo/one-process:" in line)
    assert "--spec-type draft-mtp --spec-draft-n-max 3 --metrics" in line


def test_check_config_exits_2_listing_problems(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[server]\nport = -1\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 2
    assert "server.port" in result.stderr
    assert "models: Field required" in result.stderr


def test_toml_syntax_error_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "syntax.toml"
    path.write_text("[server\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 2
    assert "TOML syntax" in result.stderr


def test_embedded_default_answers_any_model_name() -> None:
    # As a single llama-server does: Claude Code's claude-* names, Codex's gpt-*, none at all.
    settings = load_settings(None)
    catalog = ModelCatalog(settings.models, settings.model_names)
    for name in ("claude-opus-4-5", "claude-haiku-4-5", "gpt-5-codex", "demo", "", None):
        assert catalog.resolve(name) == "mtp-demo", name

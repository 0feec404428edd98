"""proxy.config.overrides: the MTP_PROXY_* variables of the environment and of a systemd unit,
matched to the settings they override, against what the file says; the learned file in force
(what check-config prints and tune --apply seeds)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from proxy.config.overrides import (
    LearnedFileInForce,
    Variable,
    effective_learned_file,
    environment_variables,
    overrides,
    service_variables,
    unit_config_file,
    unit_variables,
)
from proxy.config.settings import Settings, load_settings
from tests.support.deploy_files import UNIT

FILE = {
    "server": {"admin_key": "file-key", "port": 8080},
    "routing": {"learned_file": "/srv/state.json"},
    "models": [{"name": "m", "backend": "simulator", "profiles": [{"name": "off"}]}],
}


def test_the_shipped_unit_runs_etc_config_and_sets_the_state_file() -> None:
    assert unit_config_file(UNIT) == Path("/etc/mtp-proxy/config.toml")
    found = unit_variables(UNIT)
    assert found["MTP_PROXY_ROUTING__LEARNED_FILE"].value == "/var/lib/mtp-proxy/learned-stats.json"
    assert found["MTP_PROXY_LOG__FORMAT"].value == "json"
    assert found["MTP_PROXY_LOG__FORMAT"].origin == str(UNIT)
    assert "HOME" not in found and "PYTHONUNBUFFERED" not in found  # only the proxy's own


def test_drop_ins_come_after_the_unit_and_an_empty_line_clears(tmp_path: Path) -> None:
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(
        "[Service]\n"
        "ExecStart=/opt/x/mtp-proxy serve --config=/srv/c.toml\n"
        'Environment=MTP_PROXY_LOG__LEVEL=debug "MTP_PROXY_SERVER__HOST=0.0.0.0"\n'
    )
    drop_ins = tmp_path / "mtp-proxy.service.d"
    drop_ins.mkdir()
    (drop_ins / "10-port.conf").write_text("[Service]\nEnvironment=MTP_PROXY_SERVER__PORT=9000\n")
    (drop_ins / "20-reset.conf").write_text(
        "[Service]\nEnvironment=\nEnvironment=MTP_PROXY_SERVER__PORT=9100\n"
    )
    assert unit_config_file(unit) == Path("/srv/c.toml")
    found = unit_variables(unit)
    assert {name: v.value for name, v in found.items()} == {"MTP_PROXY_SERVER__PORT": "9100"}
    assert found["MTP_PROXY_SERVER__PORT"].origin == str(drop_ins / "20-reset.conf")
    (drop_ins / "20-reset.conf").unlink()
    assert {name: v.value for name, v in unit_variables(unit).items()} == {
        "MTP_PROXY_LOG__LEVEL": "debug",
        "MTP_PROXY_SERVER__HOST": "0.0.0.0",
        "MTP_PROXY_SERVER__PORT": "9000",
    }


def test_each_override_with_its_value_its_variable_and_the_files_value() -> None:
    environ = {
        "MTP_PROXY_ROUTING__LEARNED_FILE": "/var/lib/mtp-proxy/learned-stats.json",
        "mtp_proxy_server__port": "9000",  # pydantic-settings reads names in any case
        "MTP_PROXY_SERVER__ADMIN_KEY": "env-key",
        "MTP_PROXY_SERVR__PORT": "1",  # a typo
        "MTP_PROXY_ADMIN_KEY": "status-reads-this",  # not a setting: mtp-proxy status's
        "HOME": "/root",
    }
    variables = environment_variables(environ)
    settings = Settings(
        **{
            **FILE,
            "server": {"admin_key": "env-key", "port": 9000},
            "routing": {"learned_file": "/var/lib/mtp-proxy/learned-stats.json"},
        }
    )
    found, unknown = overrides(settings, FILE, variables)
    lines = {o.key: o.line() for o in found}
    assert lines["routing.learned_file"] == (
        'routing.learned_file = "/var/lib/mtp-proxy/learned-stats.json" from '
        "MTP_PROXY_ROUTING__LEARNED_FILE (this shell's environment; the file says "
        '"/srv/state.json")'
    )
    assert lines["server.port"].startswith("server.port = 9000 from mtp_proxy_server__port")
    # Secrets never shown, neither the environment's nor the file's.
    assert lines["server.admin_key"] == (
        'server.admin_key = "[redacted]" from MTP_PROXY_SERVER__ADMIN_KEY (this shell\'s '
        'environment; the file says "[redacted]")'
    )
    assert [v.name for v in unknown] == ["MTP_PROXY_SERVR__PORT"]


def test_a_setting_the_file_leaves_out_and_a_whole_table() -> None:
    variables = {
        "MTP_PROXY_LOG__FORMAT": Variable("MTP_PROXY_LOG__FORMAT", "json", "/etc/x.service"),
        "MTP_PROXY_COMPAT": Variable("MTP_PROXY_COMPAT", "{}", "environment"),
    }
    settings = Settings(**{**FILE, "log": {"format": "json"}})
    found, _ = overrides(settings, FILE, variables)
    lines = {o.key: o.line() for o in found}
    assert lines["log.format"] == (
        'log.format = "json" from MTP_PROXY_LOG__FORMAT (Environment= in /etc/x.service; '
        "the file does not set it)"
    )
    assert lines["compat"].startswith("compat = { responses_stream_indices = true, ")
    assert lines["compat"].endswith(
        "} from MTP_PROXY_COMPAT (this shell's environment; the file does not set it)"
    )


def _files(tmp_path: Path, served: str = "config.toml") -> tuple[Path, Path]:
    """A config whose routing.learned_file is /srv/state.json, and a unit that serves `served`
    (through a link: a unit names the file by any path) and sets the variable."""
    config = tmp_path / "config.toml"
    config.write_text('[routing]\nstate_file = "/srv/state.json"\n')
    (tmp_path / "link.toml").symlink_to(config)
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(
        f"[Service]\nExecStart=/opt/x/mtp-proxy serve --config {tmp_path / served}\n"
        "Environment=MTP_PROXY_ROUTING__LEARNED_FILE=/var/lib/x.json\n"
    )
    return config, unit


def test_which_state_file_is_in_force(tmp_path: Path) -> None:
    config, _ = _files(tmp_path)
    bare = tmp_path / "bare.toml"
    bare.write_text("[routing]\n")
    assert effective_learned_file(bare, {}).line().startswith("learned statistics: not kept")
    assert effective_learned_file(config, {}).line() == (
        "learned statistics: /srv/state.json (from the file's routing.learned_file)"
    )
    variable = Variable("MTP_PROXY_ROUTING__LEARNED_FILE", "/var/lib/x.json", "/etc/u.service")
    assert effective_learned_file(config, {variable.name: variable}).line() == (
        "learned statistics: /var/lib/x.json (from MTP_PROXY_ROUTING__LEARNED_FILE "
        "(Environment= in /etc/u.service))"
    )


def test_the_installed_units_environment_beats_the_shells_when_it_serves_the_file(
    tmp_path: Path,
) -> None:
    config, unit = _files(tmp_path, served="link.toml")
    shell = {"MTP_PROXY_ROUTING__LEARNED_FILE": "/tmp/shell.json", "MTP_PROXY_LOG__LEVEL": "debug"}
    variables = service_variables(config, shell, installed=unit)
    assert effective_learned_file(config, variables) == LearnedFileInForce(
        Path("/var/lib/x.json"), f"MTP_PROXY_ROUTING__LEARNED_FILE (Environment= in {unit})"
    )
    assert variables["MTP_PROXY_LOG__LEVEL"].origin == "environment"  # the shell's others stay
    # A unit of another file: this shell's environment, as `serve` from this shell would.
    other = tmp_path / "other.toml"
    other.write_text(config.read_text())
    assert effective_learned_file(other, service_variables(other, shell, installed=unit)) == (
        LearnedFileInForce(
            Path("/tmp/shell.json"), "MTP_PROXY_ROUTING__LEARNED_FILE (this shell's environment)"
        )
    )
    # A unit named (check-config --unit) applies whatever it serves.
    assert service_variables(other, {}, unit)["MTP_PROXY_ROUTING__LEARNED_FILE"].origin == str(unit)


def test_the_learned_files_former_name_is_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # routing.learned_file was routing.state_file: a file, a unit or a shell that names it so
    # keeps its learned file, and check-config and tune --apply see it as that setting.
    old = {**FILE, "routing": {"state_file": "/srv/old.json"}}
    assert Settings(**old).routing.learned_file == Path("/srv/old.json")
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps(old))
    monkeypatch.setenv("MTP_PROXY_ROUTING__STATE_FILE", "/var/lib/old.json")
    assert load_settings(config).routing.learned_file == Path("/var/lib/old.json")
    variables = environment_variables({"MTP_PROXY_ROUTING__STATE_FILE": "/var/lib/old.json"})
    found, unknown = overrides(Settings(**old), old, variables)
    assert [o.key for o in found] == ["routing.learned_file"] and unknown == []
    assert found[0].file_value == '"/srv/old.json"'
    assert effective_learned_file(config, variables).path == Path("/var/lib/old.json")
    assert effective_learned_file(config, {}).path == Path("/srv/old.json")

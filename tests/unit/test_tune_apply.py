"""`tune --apply`: the running unit whose service it reloads, the config rewritten with a backup
and its comments kept, a proxy that does not overwrite a learned file another writer replaced; and
tune's own processes refused where the service's model already occupies the GPU. (Which state
file it seeds: tests/unit/test_overrides.py.)"""

from __future__ import annotations

import os
import shlex
import tomllib
from pathlib import Path

import pytest

from proxy.cli.main import _parser
from proxy.config.overrides import LearnedFileInForce
from proxy.config.routing import RoutingSettings
from proxy.config.settings import Settings, load_settings
from proxy.lifecycle.learned_file import LearnedFile
from proxy.routing.stats import LearnedStats
from proxy.tune.plan.grid import OFF, DraftSetting
from proxy.tune.report.apply import ApplyError, UnitProcess, parse_show, write_config, write_state
from proxy.tune.report.recommend import Profile, Recommendation
from proxy.tune.run.guard import second_copy_refusal
from supervisor.memory import GIB
from tests.support.fake_gpu import sparse

CONFIG = """# my box: keep this comment
[server]
admin_key = "k"

[routing]
learned_file = "/srv/state.json"  # the file's own

[[models]]
name = "m"
backend = "simulator"
draft_control = "per-request"
args = ["-np", "1"]

[[models.profiles]]
name = "off"

[[models.profiles]]
name = "max"  # the old name
spec_type = "draft-mtp"
draft_n_max = 3
env = { CUDA_VISIBLE_DEVICES = "0" }
"""


def _config(tmp_path: Path, *, pool: bool = True) -> Path:
    path = tmp_path / "config.toml"
    text = CONFIG if pool else CONFIG.replace('env = { CUDA_VISIBLE_DEVICES = "0" }\n', "")
    path.write_text(text.replace("per-request", "per-process") if pool else text)
    path.chmod(0o640)
    return path


def test_the_units_main_process_once_it_runs() -> None:
    shown = "MainPID=4242\nActiveState=active\n"
    assert parse_show("mtp-proxy.service", shown) == UnitProcess("mtp-proxy.service", 4242)
    assert parse_show("u", shown.replace("active", "reloading")) == UnitProcess("u", 4242)
    # Starting up, its SIGHUP handler may not be there yet: not signalled.
    assert parse_show("u", shown.replace("active", "activating")) is None
    assert parse_show("u", "MainPID=0\nActiveState=inactive\n") is None
    assert parse_show("u", "MainPID=0\nActiveState=active\n") is None
    assert parse_show("u", "MainPID=\nActiveState=active\n") is None
    assert parse_show("x.service", "LoadState=not-found\n") is None


def _rec() -> Recommendation:
    return Recommendation(
        profiles=[Profile("off", OFF), Profile("n2", DraftSetting(2)),
                  Profile("n3-m1", DraftSetting(3, 1))],
        needs={},
    )  # fmt: skip


def test_apply_rewrites_the_profiles_and_roles_keeps_comments_and_a_backup(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    lines = write_config(config, "m", _rec(), tmp_path)
    text = config.read_text()
    assert "# my box: keep this comment" in text and '"/srv/state.json"  # the file\'s own' in text
    data = tomllib.loads(text)
    profiles = data["models"][0]["profiles"]
    assert [p["name"] for p in profiles] == ["off", "n2", "n3-m1"]
    assert profiles[2] == {
        "name": "n3-m1", "spec_type": "draft-mtp", "draft_n_max": 3, "draft_n_min": 1,
        "env": {"CUDA_VISIBLE_DEVICES": "0"},  # a pool's new profile gets the old ones' env
    }  # fmt: skip
    assert data["routing"]["profile_max"] == "n3-m1" and data["routing"]["profile_min"] == "n2"
    assert config.stat().st_mode & 0o777 == 0o640
    backups = list(tmp_path.glob("config.toml.*.bak"))
    assert len(backups) == 1 and "per-process" in backups[0].read_text()
    assert str(backups[0]) in lines[0]
    load_settings(config)  # what the service will load


def test_apply_keeps_the_running_processs_start_depth(tmp_path: Path) -> None:
    config = _config(tmp_path, pool=False)
    rec = Recommendation(profiles=[Profile("off", OFF), Profile("n2", DraftSetting(2))], needs={})
    write_config(config, "m", rec, tmp_path, keep_start_depth=3)
    assert tomllib.loads(config.read_text())["models"][0]["draft_n_max"] == 3


def test_apply_writes_nothing_that_would_not_validate(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with pytest.raises(ApplyError, match="no \\[\\[models\\]\\] entry named 'nope'"):
        write_config(config, "nope", _rec(), tmp_path)
    config.write_text(CONFIG.replace('backend = "simulator"', 'backend = "quantum"'))
    with pytest.raises(ApplyError, match="would not validate"):
        write_config(config, "m", _rec(), tmp_path)
    assert "quantum" in config.read_text() and not list(tmp_path.glob("*.bak"))


def test_the_proxy_does_not_overwrite_a_state_file_another_writer_replaced(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    routing = RoutingSettings()
    mine = LearnedFile(path)
    stats = mine.load(routing)  # missing: starts empty
    assert mine.save(stats.dumps())  # the proxy's own file: written
    assert not mine.replaced()
    LearnedStats(routing).save(path)  # another writer (tune --apply) replaces it
    assert mine.replaced()
    before = path.read_bytes()
    assert not mine.save(b'{"version": 1, "cells": []}')  # kept as the other writer left it
    assert path.read_bytes() == before
    mine.load(routing)  # the reload reads it: the proxy's own again
    assert not mine.replaced() and mine.save(stats.dumps())


def _gpu_settings(model_path: Path, *, env: dict[str, str] | None = None) -> Settings:
    profile: dict[str, object] = {"name": "off"}
    if env:
        profile["env"] = env
    return Settings(
        server={"port": 8080},
        models=[
            {
                "name": "big",
                "backend": "llama-server",
                "draft_control": "per-process",
                "model_path": str(model_path),
                "args": ["-c", "8192"],
                "profiles": [profile],
            }
        ],
    )


def test_no_second_copy_of_the_weights_on_the_gpu_the_service_uses(tmp_path: Path) -> None:
    settings = _gpu_settings(
        sparse(tmp_path / "m.gguf", 16 * GIB), env={"CUDA_VISIBLE_DEVICES": "0"}
    )
    model = settings.models[0]
    serving = {"status": "ok", "ready_backends": {"big": 1}}
    refusal = second_copy_refusal(
        settings, model, health=lambda host, port: serving, free_memory=lambda: [int(7 * GIB)]
    )
    assert refusal is not None
    assert "the service at http://127.0.0.1:8080 is running and serves big on GPU 0" in refusal
    assert "second copy of the weights" in refusal and "7.00 GiB free now" in refusal
    assert "mtp-proxy tune --url http://127.0.0.1:8080 --admin-key=KEY" in refusal
    # As printed, it parses whatever the key begins with ("--admin-key KEY" read "-k3y" as a flag).
    command = refusal.split("instead: mtp-proxy ", 1)[1].split(" (", 1)[0]
    words = shlex.split(command.replace("KEY", "-k3y"))
    assert _parser().parse_args(words).admin_key == "-k3y"
    # Nothing answers at the service's address: the box is tune's.
    assert second_copy_refusal(settings, model, health=lambda h, p: None) is None
    # The service serves nothing on that GPU (another model), or the model runs on the CPU.
    other = {"status": "ok", "ready_backends": {"small": 1}}
    assert second_copy_refusal(settings, model, health=lambda h, p: other) is None
    cpu = _gpu_settings(sparse(tmp_path / "c.gguf", GIB), env={"CUDA_VISIBLE_DEVICES": ""})
    assert second_copy_refusal(cpu, cpu.models[0], health=lambda h, p: serving) is None


def test_applied_files_keep_the_owners_the_service_reads_them_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as root (sudo) on /etc/mtp-proxy and /var/lib/mtp-proxy: the new config keeps its
    owners and mode, and the learned file those of the old one, or its folder's (the service's
    own user) for a new one; otherwise the service could no longer read them."""
    config = _config(tmp_path)
    mine = (os.geteuid(), os.getegid())
    monkeypatch.setattr("proxy.tune.report.apply.os.geteuid", lambda: mine[0] + 1)  # as if root
    chowned: list[tuple[str, int, int]] = []
    monkeypatch.setattr(
        "proxy.tune.report.apply.os.chown",
        lambda path, uid, gid: chowned.append((Path(path).name, uid, gid)),
    )
    write_config(config, "m", _rec(), tmp_path)
    assert chowned and chowned[0][1:] == mine  # the temp file, renamed onto the config
    assert config.stat().st_mode & 0o777 == 0o640
    chowned.clear()
    state = tmp_path / "state" / "learned.json"
    state.parent.mkdir()
    state.parent.chmod(0o750)
    lines, written = write_state(
        LearnedFileInForce(state, "test"), lambda base: base, RoutingSettings(), tmp_path
    )
    assert written, lines
    assert chowned == [("learned.json", *mine)]
    assert state.stat().st_mode & 0o777 == 0o640  # group-readable, as its folder

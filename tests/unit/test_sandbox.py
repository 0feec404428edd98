"""The service unit's sandbox read from its files: the shipped unit is what `init` assumes
before one is installed, each hidden or read-only path is named with the directive that hides
it, and the drop-in printed as the fix opens it once written beside the unit."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from proxy.config.sandbox import (
    SHIPPED,
    Sandbox,
    read_problem,
    read_sandbox,
    service_sandbox,
    write_problem,
)

SHIPPED_UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "mtp-proxy.service"
MODEL = Path("/home/alice/models/Qwen3.6-27B-Q4_K_M.gguf")


def test_the_shipped_sandbox_is_the_shipped_units() -> None:
    assert dataclasses.replace(read_sandbox(SHIPPED_UNIT), unit=None) == SHIPPED


def test_what_the_shipped_sandbox_hides_and_keeps_read_only() -> None:
    assert SHIPPED.hides(MODEL) == "ProtectHome=yes hides /home, /root and /run/user"
    assert SHIPPED.hides(Path("/root/m.gguf")) is not None
    assert (
        SHIPPED.hides(Path("/tmp/m.gguf")) == "PrivateTmp=yes gives the service its own empty /tmp"
    )
    assert SHIPPED.hides(Path("/srv/models/m.gguf")) is None
    assert SHIPPED.hides(Path("/homework/m.gguf")) is None  # a prefix is not a folder
    assert SHIPPED.forbids_writing(Path("/var/lib/mtp-proxy/learned-stats.json")) is None
    assert SHIPPED.forbids_writing(Path("/srv/state/learned.json")) == (
        "ProtectSystem=strict makes it read-only"
    )
    assert SHIPPED.forbids_writing(Path("/etc/mtp-proxy/learned.json")) == (
        "ReadOnlyPaths= makes /etc/mtp-proxy read-only"
    )
    assert Sandbox().hides(MODEL) is None  # a unit without a sandbox hides nothing


def test_a_link_into_a_home_is_hidden_too(tmp_path: Path) -> None:
    sandbox = Sandbox(protect_home="yes")
    link = tmp_path / "m.gguf"
    link.symlink_to(MODEL)
    problem = read_problem(sandbox, link)
    assert problem is not None and f"the service cannot see {MODEL}" in problem


def drop_in(problem: str) -> str:
    """The drop-in's lines as the message prints them, indented under its path."""
    return "".join(line.strip() + "\n" for line in problem.splitlines() if line.startswith("    "))


def test_the_printed_drop_in_opens_the_folder(tmp_path: Path) -> None:
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(SHIPPED_UNIT.read_text())
    problem = read_problem(service_sandbox(unit), MODEL)
    assert problem is not None
    assert problem.startswith(f"the service cannot see {MODEL}: ProtectHome=yes hides /home")
    assert f"({unit})" in problem
    assert "/etc/systemd/system/mtp-proxy.service.d/models.conf" in problem
    assert "or ProtectHome=read-only" in problem and "daemon-reload" in problem
    text = drop_in(problem)
    assert text == "[Service]\nProtectHome=tmpfs\nBindReadOnlyPaths=/home/alice/models\n"
    (tmp_path / "mtp-proxy.service.d").mkdir()
    (tmp_path / "mtp-proxy.service.d" / "models.conf").write_text(text)
    assert read_problem(read_sandbox(unit), MODEL) is None
    # The wider fix the message names works as well.
    (tmp_path / "mtp-proxy.service.d" / "models.conf").write_text(
        "[Service]\nProtectHome=read-only\n"
    )
    assert read_problem(read_sandbox(unit), MODEL) is None


def test_a_learned_file_the_service_cannot_write_gets_read_write_paths(tmp_path: Path) -> None:
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(SHIPPED_UNIT.read_text())
    state = Path("/srv/state/learned.json")
    problem = write_problem(read_sandbox(unit), state)
    assert problem is not None and "ProtectSystem=strict makes it read-only" in problem
    assert drop_in(problem) == "[Service]\nReadWritePaths=/srv/state\n"
    (tmp_path / "mtp-proxy.service.d").mkdir()
    (tmp_path / "mtp-proxy.service.d" / "state.conf").write_text(drop_in(problem))
    assert write_problem(read_sandbox(unit), state) is None
    # Under a home the only fix is another place.
    home = write_problem(SHIPPED, Path("/home/alice/learned.json"))
    assert home is not None and home.endswith(
        "keep it in /var/lib/mtp-proxy (the unit's StateDirectory=)"
    )


def test_bind_targets_and_resets_are_read_as_systemd_reads_them(tmp_path: Path) -> None:
    unit = tmp_path / "u.service"
    unit.write_text(
        "[Service]\nProtectHome=tmpfs\nBindReadOnlyPaths=-/data/m:/home/bob/models:rbind\n"
        "ReadWritePaths=/srv/a\nReadWritePaths=\nReadWritePaths=/srv/b\n"
    )
    sandbox = read_sandbox(unit)
    assert sandbox.bound == (Path("/home/bob/models"),)
    assert sandbox.writable == (Path("/srv/b"),)
    assert re.search("tmpfs", sandbox.hides(Path("/home/alice/m.gguf")) or "")
    assert sandbox.hides(Path("/home/bob/models/m.gguf")) is None

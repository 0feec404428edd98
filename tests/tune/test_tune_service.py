"""`mtp-proxy tune` on the box that serves, on the simulator: through the running service and
applied to it, refused where it would start a second copy of the weights, an estimate that
follows the simulator's time scale, and failures counted by class instead of printed each.

The same on the real llama-server: tests/llama/test_tune_llama.py.
"""

from __future__ import annotations

import http.server
import json
import os
import random
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.tune.measure.failures import SKIPPED
from proxy.workloads import texts
from tests.support.fake_gpu import fake_nvidia_smi, sparse
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.tune_helpers import (
    document,
    first_decision,
    run_tune,
    run_tune_url,
    sim_config,
    write_config,
)

GIB = 1 << 30


@pytest.fixture
def fake_service() -> Iterator[int]:
    """Something answering /health like a running mtp-proxy that serves model "big"."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": "ok", "ready_backends": {"big": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_refuses_a_second_copy_on_the_gpu_the_running_service_uses(
    tmp_path: Path, fake_service: int
) -> None:
    model = {
        "name": "big",
        "backend": "llama-server",
        "binary": sys.executable,  # never started: the refusal comes first
        "model_path": str(sparse(tmp_path / "big.gguf", 16 * GIB)),
        "draft_control": "per-request",
        "args": ["-c", "32768", "-ngl", "99"],
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
        "profiles": [{"name": "off"}, {"name": "max", "spec_type": "draft-mtp"}],
    }
    config = write_config(tmp_path, {"server": {"port": fake_service}, "models": [model]})
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake_nvidia_smi(tmp_path / 'bin', 6000)}:{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "proxy.cli", "tune", "--config", str(config), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert f"refused: the service at http://127.0.0.1:{fake_service} is running" in done.stderr
    assert "serves big on GPU 0" in done.stderr and "5.86 GiB free now" in done.stderr
    assert f"mtp-proxy tune --url http://127.0.0.1:{fake_service} --admin-key=KEY" in done.stderr
    assert not out.exists()  # nothing started, nothing measured


def _admin(proxy: ProxyProcess, path: str) -> Any:
    status, body = proxy.get_json(path, admin_key=ADMIN_KEY)
    assert status == 200, body
    return body


def test_url_then_apply_seeds_the_state_the_service_reads_and_reloads_it(tmp_path: Path) -> None:
    """Measured through the service on one process and applied to it: the learned file in force
    (the service says which), the config with profiles named by their setting and their roles,
    the SIGHUP; the process is not replaced, and the first request is routed `learned`."""
    state = tmp_path / "state" / "learned.json"
    model = simulator_model(
        preset="setup-b", time_scale=500.0, slots=2, draft_control="per-request",
        extra_args=["--latent-sigma", "0"],
    )  # fmt: skip
    routing = {"learned_file": str(state), "clock_scale": 500.0, "exploration_rate": 0.0,
               "cold_exploration_rate": 0.0}  # fmt: skip
    config = {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN_KEY},
        "log": {"level": "info", "format": "json"},
        "supervisor": {"stagger_s": 0.0},
        "routing": routing,
        "models": [model],
    }
    with running_proxy(config, tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        before = _admin(proxy, "/admin/backends")["backends"][0]
        config_file = tmp_path / "proxy" / "config.toml"
        done = run_tune_url(
            proxy.url, ADMIN_KEY, tmp_path / "out", "--settings", "off,1,3,4,3/1", "--repeats", "2",
            "--apply", str(config_file),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        profile, reason = first_decision(proxy.url)
        after = _admin(proxy, "/admin/backends")["backends"][0]
        service = _admin(proxy, "/admin/service")
    assert "n4: n_max 4 is deeper than the running process (3)" in done.stderr
    assert "n3-m1: needs n_min 1" in done.stderr
    assert reason.split(" ")[0] == "learned", reason
    assert profile == "n3"  # n_max 3 is 1.7x off on a short chat (setup-b)
    assert after["pid"] == before["pid"] and after["restarts"] == 0
    written = tomllib.loads(config_file.read_text())
    assert [p["name"] for p in written["models"][0]["profiles"]] == ["off", "n3"]
    assert written["routing"]["profile_max"] == "n3"
    assert [p["name"] for p in service["models"][0]["profiles"]] == ["off", "n3"]
    assert service["routing"]["profile_max"] == "n3"  # the roles reloaded too
    applied = [line for line in done.stdout.splitlines() if line.startswith("applied: ")]
    said = f"learned file: {state}"
    assert any(said in line and "GET /admin/service" in line for line in applied)
    assert any("SIGHUP" in line for line in applied)


def test_apply_to_the_running_demo_without_a_state_file_exits_0_and_it_serves_them(
    tmp_path: Path,
) -> None:
    """The demo keeps no learned file: that is a note, not a failure; the service is the one
    tune talked to, it is reloaded and serves the new profiles, and the exit code is 0. Applied
    to a file the service does not read, it says so (never "not running") and exits 4."""
    model = simulator_model(
        preset="setup-b", time_scale=500.0, slots=2, draft_control="per-request",
        extra_args=["--latent-sigma", "0"],
    )  # fmt: skip
    config = {
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN_KEY},
        "supervisor": {"stagger_s": 0.0},
        "routing": {"clock_scale": 500.0},
        "models": [model],
    }
    with running_proxy(config, tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        other = tmp_path / "other.toml"
        other.write_text((tmp_path / "proxy" / "config.toml").read_text())
        elsewhere = run_tune_url(
            proxy.url, ADMIN_KEY, tmp_path / "out", "--settings", "off,3", "--repeats", "2",
            "--apply", str(other),
        )  # fmt: skip
        done = run_tune_url(
            proxy.url, ADMIN_KEY, tmp_path / "out", "--settings", "off,3", "--repeats", "2",
            "--apply", str(tmp_path / "proxy" / "config.toml"),
        )  # fmt: skip
        service = _admin(proxy, "/admin/service")
    assert elsewhere.returncode == 4, elsewhere.stdout[-2000:]
    assert "not running" not in elsewhere.stdout
    assert f"not applied: the service at {proxy.url} (pid " in elsewhere.stdout
    assert f"not {other}: it is not reloaded" in elsewhere.stdout
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("note: learned file: none in force") for line in lines)
    assert any(line.startswith("applied: reload asked of the service (SIGHUP") for line in lines)
    assert "applied: the service serves off, n3; learned state: " in done.stdout
    assert not any(line.startswith("not applied") for line in lines)
    assert [p["name"] for p in service["models"][0]["profiles"]] == ["off", "n3"]


def test_quick_follows_the_simulators_time_scale_and_is_provisional(tmp_path: Path) -> None:
    """--quick: the short grid, one repeat; the estimate comes from a warm-up at the simulator's
    time scale (given on the command line) and says the time at real speed too."""
    config = write_config(tmp_path, sim_config("setup-b", 8192, time_scale=1.0))
    out = tmp_path / "out"
    done = run_tune(config, out, "--quick", "--time-scale", "100")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "settings (4): off, n_max 2, n_max 3, n_max 3 / n_min 1" in done.stderr
    assert "x 1 repeats = 24;" in done.stderr
    estimate = re.search(
        r"estimated time: ~(\S+) \(measured by a warm-up on the first backend: .*at real speed "
        r"\(the simulator runs 100x fast\) the requests take ~(\S+)\.", done.stderr,
    )  # fmt: skip
    assert estimate is not None, done.stderr
    wall, real = (_seconds(text) for text in estimate.groups())
    # Both are printed to the second: the wall time may be rounded down by up to 1 s. The wall
    # estimate adds the backend starts, so real speed is at most 100x it and not far below.
    assert 50 * (wall - 1) <= real <= 100 * (wall + 1)
    # The headline is what it measured: n_max 3 faster alone on short requests (setup-b).
    headline = next(line for line in done.stdout.splitlines() if line.startswith("measured"))
    assert headline.startswith("measured (PROVISIONAL: ") and "(no spread to judge by)): " in (
        headline
    )
    found = re.search(r"\): n_max 3( / n_min 1)? measured fastest in (\d) of (\d) ", headline)
    assert found is not None and found.group(2) == found.group(3), headline
    assert (
        f"confirm with: mtp-proxy tune --config {config} --time-scale 100 --settings "
        f"off,2,3,3/1 --repeats 3 --out {out}"
    ) in done.stdout
    assert "recommended profiles for now: off (PROVISIONAL" in done.stdout
    assert document(out)["run"]["provisional"].endswith("(no spread to judge by)")


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert match is not None, text
    h, m, s = (int(x) if x else 0 for x in match.groups())
    return h * 3600 + m * 60 + s


def test_failures_are_a_table_and_a_dead_class_is_not_retried(tmp_path: Path) -> None:
    """A request the backend refuses every time: counted per class and reason (one table, one
    first notice), its class not tried past its first repeat, and the plan incomplete (exit 3)."""
    rng = random.Random(1)
    good = {"messages": [{"role": "user", "content": "Hi! How are you today?"}],
            "max_tokens": 32}  # fmt: skip
    code = texts.code_file(rng, 20_000)
    bad = {
        "messages": [{"role": "user", "content": f"```python\n{code}```\nFix it."}],
        "max_tokens": 32,
        "n_predict": "many",
    }  # the simulator answers 400, as llama-server
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"at": 0.0, "session": None, "path": "/v1/chat/completions", "body": b})
            + "\n"
            for b in (good, good, bad)
        )
    )
    config = write_config(tmp_path, sim_config("setup-b", 16384))
    out = tmp_path / "out"
    done = run_tune(
        config, out, "--workload", str(trace), "--settings", "off,3", "--repeats", "3",
        "--mode", "per-process",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    failures = {(f["class"], f["reason"]): f["count"] for f in document(out)["failures"]}
    assert failures == {("4k-16k/code", "HTTP 400"): 2, ("4k-16k/code", SKIPPED): 4}
    assert done.stderr.count("further failures of this class and reason") == 1
    assert "failures (requests per class and reason):" in done.stdout
    no_data = {item["class"]: item["reason"] for item in document(out)["no_data"]}
    assert list(no_data) == ["4k-16k/code"] and "every request failed" in no_data["4k-16k/code"]

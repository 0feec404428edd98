"""`mtp-proxy status` against a running proxy: the backends, routing mix and learned tables with
the numbers the proxy really holds, and clear failures when it cannot read them."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    free_port,
    proxy_config,
    running_proxy,
    simulator_model,
)
from tests.support.traffic import Sent, body_for, standard_mix, wait_all_ready

PROFILES = ("off", "min", "max")


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )


def table(output: str, title: str) -> list[dict[str, str]]:
    """The rows of the table printed under `title`, as dicts keyed by column header."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header, rule = lines[start + 1], lines[start + 2]
    assert set(rule) <= {"-", " "}, rule
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    spans[-1] = (spans[-1][0], 10_000)  # the last column may be wider than its rule
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    for line in lines[start + 3 :]:
        if not line.strip():
            break
        rows.append({n: line[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)})
    return rows


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("status-proxy")
    with running_proxy(proxy_config(), workdir) as running:
        wait_all_ready(running)
        yield running


@pytest.fixture(scope="module")
def sent(proxy: ProxyProcess) -> list[Sent]:
    return standard_mix(proxy.url)


def test_status_prints_the_three_tables_with_real_numbers(
    proxy: ProxyProcess, sent: list[Sent]
) -> None:
    result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
    print(result.stdout)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"mtp-proxy at {proxy.url}: 3/3 backends ready")

    backends = table(out, "Backends")
    assert [(b["backend"], b["profile"], b["state"]) for b in backends] == [
        (f"mtp-demo/{p}", p, "ready") for p in PROFILES
    ]
    _, admin = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    pids = {b["name"]: str(b["pid"]) for b in admin["backends"]}
    for row in backends:
        assert row["pid"] == pids[row["backend"]]
        assert (row["restarts"], row["in-flight"]) == ("0", "0/4")
        assert re.fullmatch(r"\d+m\d\ds", row["uptime"]), row

    mix = table(out, "Routing mix")
    routed = [s for s in sent if s.routed]
    assert sum(int(r["requests"]) for r in mix) == len(routed)
    pinned = {r["profile"]: int(r["requests"]) for r in mix if r["reason"] == "pinned"}
    assert pinned == {"off": 6, "min": 5, "max": 5}  # 5 chats each, and /messages pinned to off
    for row in mix:
        share = int(row["requests"]) / len(routed)
        assert row["share"] == f"{share:.0%}"

    learned = {(r["class"], r["load"], r["profile"]): r for r in table(out, "Learned table")}
    _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    keys = {(r["request_class"], r["load_level"], r["profile"]) for r in routing["learned"]}
    assert set(learned) == keys
    for row in routing["learned"]:
        shown = learned[(row["request_class"], row["load_level"], row["profile"])]
        assert shown["decode tok/s"] == f"{row['decode_tok_s']:.1f}"
        assert shown["samples"] == str(row["samples"])
        expected = "-" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        assert shown["acceptance"] == expected
    for profile in ("min", "max"):  # speculative profiles: a real acceptance, off: none
        assert re.fullmatch(r"\d+%", learned[("<4k/prose", "any", profile)]["acceptance"])
    assert learned[("<4k/prose", "any", "off")]["acceptance"] == "-"


def test_status_shows_a_request_in_flight(proxy: ProxyProcess, sent: list[Sent]) -> None:
    # A long stream pinned to max (~5 s at the simulator's compressed time), open while we look.
    body = {**body_for("chat", stream=True, max_tokens=6000), "ignore_eos": True}
    client = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        client.request("POST", "/v1/chat/completions", json.dumps(body), {"X-MTP-Profile": "max"})
        response = client.getresponse()
        assert response.status == 200 and response.read(64)  # streaming: in flight now
        result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
    finally:
        client.close()  # the proxy cancels the rest
    assert result.returncode == 0, result.stderr
    rows = {row["backend"]: row["in-flight"] for row in table(result.stdout, "Backends")}
    assert rows == {"mtp-demo/off": "0/4", "mtp-demo/min": "0/4", "mtp-demo/max": "1/4"}


def test_admin_key_from_the_environment(proxy: ProxyProcess) -> None:
    result = status("--url", proxy.url, env={**os.environ, "MTP_PROXY_ADMIN_KEY": ADMIN_KEY})
    assert result.returncode == 0, result.stderr
    assert "Learned table" in result.stdout


def test_nothing_listening_exits_1_with_a_clear_message() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = status("--url", url, "--admin-key", ADMIN_KEY)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"mtp-proxy status: cannot reach mtp-proxy at {url}")
    assert "Connection refused" in result.stderr and "Traceback" not in result.stderr


def test_wrong_or_missing_admin_key_exits_1_saying_so(proxy: ProxyProcess) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MTP_PROXY_ADMIN_KEY"}
    for args in (["--admin-key", "not-the-key"], []):
        result = status("--url", proxy.url, *args, env=env)
        assert result.returncode == 1
        assert "refused the admin key" in result.stderr, result.stderr
        assert "not-the-key" not in result.stderr


def test_not_a_url_exits_1() -> None:
    result = status("--url", "127.0.0.1:8080")
    assert result.returncode == 1
    assert "must be an http:// or https:// URL" in result.stderr


def test_draft_control_is_the_same_in_status_admin_and_metrics(proxy: ProxyProcess) -> None:
    """The probe's verdict per backend: off has no speculation; min and max were asked."""
    result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
    assert result.returncode == 0, result.stderr
    shown = {row["backend"]: row["draft control"] for row in table(result.stdout, "Backends")}
    _, admin = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    held = {b["name"]: b["draft_control"] for b in admin["backends"]}
    reasons = {b["name"]: b["draft_control_reason"] for b in admin["backends"]}
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    metric = {
        sample.labels["backend"]: sample.labels["control"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_draft_control" and sample.value == 1
    }
    assert shown == held == metric, (shown, held, metric)
    assert held["mtp-demo/off"] == "none" and "without speculation" in reasons["mtp-demo/off"]
    for profile in ("min", "max"):  # the simulator: per-request, or ignored with --ignore-...
        name = f"mtp-demo/{profile}"
        assert held[name] in ("per-request", "ignored") and "drafted" in reasons[name]


def test_the_template_check_is_the_same_in_status_admin_and_metrics(proxy: ProxyProcess) -> None:
    """The demo's setup-b simulator refuses a late system message, as the Qwen3.6 template."""
    result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
    assert result.returncode == 0, result.stderr
    shown = {row["backend"]: row["late system"] for row in table(result.stdout, "Backends")}
    _, admin = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    held = {b["name"]: b["chat_template"]["late_system"] for b in admin["backends"]}
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    metric = {
        sample.labels["backend"]: sample.labels["late_system"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_late_system" and sample.value == 1
    }
    assert shown == held == metric == {f"mtp-demo/{p}": "refused" for p in PROFILES}


def test_every_speculative_type_is_named_the_same_in_status_admin_and_metrics(
    tmp_path: Path,
) -> None:
    """A pool of three types (simulated: the simulator takes every type the pinned build
    knows): each backend is named with its own type, and its draft model's file where it has
    one, never as MTP."""
    profiles = [
        {"name": "off"},
        {"name": "min", "spec_type": "ngram-mod", "draft_n_max": 8},
        {"name": "max", "spec_type": "draft-simple", "draft_model": "/models/small-draft.gguf",
         "draft_n_max": 16},
    ]  # fmt: skip
    config = proxy_config([simulator_model(profiles=profiles)])
    expected = {
        "mtp-demo/off": ("none", None),
        "mtp-demo/min": ("ngram-mod", None),
        "mtp-demo/max": ("draft-simple", "small-draft.gguf"),
    }
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy)
        result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
        _, admin = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
        with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    assert result.returncode == 0, result.stderr
    shown = {row["backend"]: row["spec type"] for row in table(result.stdout, "Backends")}
    assert shown == {
        "mtp-demo/off": "none",
        "mtp-demo/min": "ngram-mod",
        "mtp-demo/max": "draft-simple (small-draft.gguf)",
    }
    held = {b["name"]: (b["spec_type"], b["draft_model"]) for b in admin["backends"]}
    assert held == expected
    metric = {
        sample.labels["backend"]: (sample.labels["spec_type"], sample.labels["draft_model"] or None)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_speculation_info" and sample.value == 1
    }
    assert metric == expected


def test_each_pool_process_runs_its_profiles_depth(proxy: ProxyProcess, sent: list[Sent]) -> None:
    result = status("--url", proxy.url, "--admin-key", ADMIN_KEY)
    assert result.returncode == 0, result.stderr
    rows = {row["backend"]: row for row in table(result.stdout, "Depth per process")}
    depths = {"off": "0", "min": "2", "max": "3"}
    for profile in PROFILES:
        row = rows[f"mtp-demo/{profile}"]
        assert row["depth now"] == depths[profile]
        assert row["why"] == f"pool: this process runs {profile} only"
        assert row["busy epoch"] == "-"  # no epochs: one depth per process
        assert row["last request"].startswith(f"{profile} (depth {depths[profile]}), ")


# `mtp-proxy` with Ctrl-C as at a terminal: a suite started in the background inherits SIGINT
# ignored (what a shell does to its background jobs), and the child then never hears it.
_INTERRUPTIBLE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'mtp-proxy'; runpy.run_module('proxy.cli', run_name='__main__')"
)


def watch(*args: str, frames: int, timeout: float = 30.0) -> tuple[str, int, str]:
    """Run `status --watch`, wait for `frames` redraws, press Ctrl-C: (stdout, code, stderr)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTIBLE, "status", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(process.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while sum("Ctrl-C to stop" in line for line in list(seen)) < frames:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, f"fewer than {frames} frames: {seen}"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        code = process.wait(60)  # a loaded machine may take a while to unwind
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(10)
    return "".join(seen), code, process.stderr.read() if process.stderr else ""


def test_watch_redraws_until_ctrl_c(proxy: ProxyProcess, sent: list[Sent]) -> None:
    out, code, err = watch("--url", proxy.url, "--admin-key", ADMIN_KEY, "--watch", "0.2", frames=3)
    assert code == 0 and "Traceback" not in err, err
    frames = out.split("(every 0.2 s, ")
    assert len(frames) >= 4  # three frames and what follows the last
    for frame in frames[:3]:
        assert "Backends" in frame and "Depth per process (now, and why)" in frame
        assert "Learned table" in frame


def test_watch_keeps_trying_a_proxy_it_cannot_read() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out, code, err = watch("--url", url, "--admin-key", ADMIN_KEY, "--watch", "0.1", frames=2)
    assert code == 0 and "Traceback" not in err, err
    assert out.count(f"cannot reach mtp-proxy at {url}") >= 2


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_watch_needs_a_positive_number_of_seconds(value: str) -> None:
    result = status("--url", "http://127.0.0.1:1", "--watch", value)
    assert result.returncode == 2
    assert "must be a positive number of seconds" in result.stderr

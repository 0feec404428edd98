"""Learned statistics survive a restart: real proxies sharing one `routing.learned_file`.

Setup A's simulated hardware makes `max` (n_max 3) the slowest profile on short chats, while
the cold rule sends short chats to `max`. So a proxy that knows nothing answers a short chat
with (max, rule), and one that loaded what an earlier proxy learned answers it with
(another profile, learned): the decision shows whether the file was written and read.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import tomli_w
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.routing import RoutingSettings
from proxy.routing.classes import RequestClass, bucket_labels
from proxy.routing.stats import LearnedStats
from proxy.routing.telemetry import Observation
from tests.support.cli import run_cli
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    start_proxy,
    wait_all_ready,
)
from tests.support.traffic import body_for, send

TIME_SCALE = 50.0
PROFILES = ("off", "min", "max")
CLASS = "<4k/prose"


def config(state_file: Path, *, save_interval_s: float = 3600.0) -> dict[str, Any]:
    routing = {
        "learned_file": str(state_file),
        "state_save_interval_s": save_interval_s,
        "clock_scale": TIME_SCALE,
        # No exploration: every unpinned decision is the rule's or the learned table's.
        "exploration_rate": 0.0,
        "cold_exploration_rate": 0.0,
    }
    model = simulator_model(preset="setup-a", time_scale=TIME_SCALE, extra_args=["--seed", "5"])
    return proxy_config([model], routing=routing)


def teach(proxy: ProxyProcess) -> None:
    """Six short chats pinned to each profile: past min_samples (5) for all three."""
    wait_all_ready(proxy, {"mtp-demo": 3})
    for profile in PROFILES:
        for i in range(6):
            body = body_for("chat", stream=False, text=f"tell me about harbours, part {i}")
            sent = send(proxy.url, "chat", body, headers={"X-MTP-Profile": profile})
            assert (sent.status, sent.profile) == (200, profile)


def learned(proxy: ProxyProcess) -> dict[str, float]:
    """Samples per profile in CLASS, as /admin/routing shows them."""
    status, body = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    return {r["profile"]: r["samples"] for r in body["learned"] if r["class"] == CLASS}


def saved_cells(path: Path) -> dict[str, float]:
    state = json.loads(path.read_bytes())
    cells = [c for c in state["cells"] if f"{c['bucket']}/{c['kind']}" == CLASS]
    return {c["profile"]: c for c in cells}


def observed(path: Path) -> dict[str, float]:
    return {profile: cell["decode"][3] for profile, cell in saved_cells(path).items()}


def unpinned_decision(proxy: ProxyProcess) -> tuple[str, str | None]:
    wait_all_ready(proxy, {"mtp-demo": 3})
    sent = send(proxy.url, "chat", body_for("chat", stream=False, text="and lighthouses?"))
    assert sent.status == 200
    return sent.profile, sent.reason


def test_learned_state_is_saved_at_stop_and_decides_after_a_restart(tmp_path: Path) -> None:
    state_file = tmp_path / "state" / "learned.json"
    with running_proxy(config(state_file), tmp_path / "first") as first:
        teach(first)
        taught = learned(first)
        assert set(taught) == set(PROFILES)
        assert not state_file.exists()  # the periodic save is an hour away: only the stop saves
    assert set(saved_cells(state_file)) == set(PROFILES)

    with running_proxy(config(state_file), tmp_path / "second") as second:
        assert learned(second) == taught  # loaded as it was learned
        profile, reason = unpinned_decision(second)
    assert reason == "learned", (profile, reason)
    assert profile != "max"  # setup A: max is the slowest on short chats

    # The control: the same proxy without the file decides by the cold rule.
    with running_proxy(config(tmp_path / "none.json"), tmp_path / "control") as control:
        assert unpinned_decision(control) == ("max", "rule")


def test_learned_state_is_saved_periodically_and_survives_a_crash(tmp_path: Path) -> None:
    state_file = tmp_path / "learned.json"
    crashed = start_proxy(config(state_file, save_interval_s=0.5), tmp_path / "first")
    try:
        teach(crashed)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:  # written while the proxy runs, within an interval
            # every observation saved: six per profile (decode statistics: [w, m, m2, n])
            if state_file.exists() and observed(state_file) == dict.fromkeys(PROFILES, 6):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("no periodic save of all that was learned within 10 s")
    finally:
        # No stop: SIGKILL, so nothing is saved at exit. Its backends are in sessions of their
        # own and outlive it: stopped here.
        pids = [
            b["pid"]
            for b in crashed.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
            if b.get("pid")
        ]
        crashed.process.send_signal(signal.SIGKILL)
        crashed.process.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    with running_proxy(config(state_file), tmp_path / "second") as second:
        profile, reason = unpinned_decision(second)
    assert (reason, profile != "max") == ("learned", True), (profile, reason)


def test_a_state_file_with_huge_finite_numbers_does_not_break_routing(tmp_path: Path) -> None:
    """A finite but absurd busy weight (1e308) in a learned file overflowed the busy epochs'
    arithmetic: every request answered 500. Such measurements are dropped at load like others
    (the learned cells hold such numbers without harm: they are kept)."""
    state_file = tmp_path / "learned.json"
    huge = 1e308
    busy_row = {"level": 2, "weight": huge, "weight2": huge, "mean": 3.0, "m2": huge}
    cell = {"decode": [huge, huge, huge, huge], "prefill": [huge, 1.0, 1.0, 6.0]}
    cell |= {"output": [1.0, huge, 1.0, 6.0], "acceptance": [huge, huge, 1.0, 6.0]}
    state = {
        "version": 1,
        "buckets": [4096, 16384, 32768, 65536],
        "cells": [
            {"model": "mtp-demo", "bucket": "<4k", "kind": "prose", "profile": p, "level": level}
            | cell
            for p in PROFILES
            for level in (1, 2, 4)
        ],
        "chars_per_token": {"mtp-demo": [3.5, huge]},
        "busy": {
            "mtp-demo/one-process": [
                {"class": f"{bucket}/{kind}", "profile": p, **busy_row}
                for bucket in ("<4k", "4k-16k")
                for kind in ("prose", "code")
                for p in PROFILES
            ]
        },
    }
    state_file.write_text(json.dumps(state))
    model = simulator_model(draft_control="per-request", time_scale=TIME_SCALE)
    routing = {"learned_file": str(state_file), "state_save_interval_s": 3600.0}
    with running_proxy(proxy_config([model], routing=routing), tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {"mtp-demo": 1})
        for n in range(3):  # alone, then beside others: the busy epochs' arithmetic too
            sent = [
                send(proxy.url, "chat", body_for("chat", stream=False, text=f"hello {n} {i}"))
                for i in range(1 + n)
            ]
            assert {s.status for s in sent} == {200}, sent
        report = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["state"]
    assert "dropped" in report, report


def test_saving_a_large_state_does_not_stall_the_proxy(tmp_path: Path) -> None:
    """A large learned file (12,000 cells) saved every 0.5 s: the proxy keeps answering between
    the steps of each save. Before, each save serialized it in one go on the event loop, and
    every request waited as long as that took (measured here, in this process, as a ratio's
    reference: the proxy's longest answer must stay well under it)."""
    state_file = tmp_path / "learned.json"
    settings = RoutingSettings()
    stats = LearnedStats(settings)
    levels = (0, *settings.concurrency_levels)
    for m in range(100):
        for bucket in bucket_labels(settings.context_buckets):
            for level in levels:
                for profile in PROFILES:
                    observation = Observation(
                        backend="b",
                        profile=profile,
                        request_class=RequestClass(bucket, "code"),
                        context_tokens=1000,
                        cached_tokens=0,
                        output_tokens=100,
                        draft_n=None,
                        draft_n_accepted=None,
                        decode_tok_s=30.0,
                        prefill_s=1.0,
                        ttft_s=1.0,
                        total_s=4.0,
                        source="timings",
                    )
                    for kind in ("code", "prose"):
                        cls = RequestClass(bucket, kind)
                        stats.observe(cls, profile, observation, model=f"m{m}", level=level)
    stats.save(state_file)
    began = time.perf_counter()
    stats.dumps()
    one_piece_s = time.perf_counter() - began
    conf = config(state_file, save_interval_s=0.5)
    with running_proxy(conf, tmp_path / "proxy") as proxy:
        saved = state_file.stat().st_mtime_ns
        slowest = 0.0
        saves = 0
        deadline = time.monotonic() + 30.0
        while saves < 4 and time.monotonic() < deadline:  # answers across four saves
            began = time.perf_counter()
            assert proxy.get_json("/health")[0] == 200
            slowest = max(slowest, time.perf_counter() - began)
            if (mtime := state_file.stat().st_mtime_ns) != saved:
                saved, saves = mtime, saves + 1
    assert saves >= 4
    assert slowest < one_piece_s / 2, (slowest, one_piece_s)


# --- a learned file that is not all good, a save that fails, a file the service cannot write ------


def good_and_poisoned(state_file: Path) -> bytes:
    """A learned file of three learned cells, one of them with a number that is not finite."""
    settings = RoutingSettings(min_samples=1)
    stats = LearnedStats(settings)
    cls = RequestClass("<4k", "prose")
    for profile in PROFILES:
        observation = Observation(
            "mtp-demo/off", profile, cls, 500, 0, 64, None, None, 30.0, 0.1, 0.1, 2.2, "timings"
        )
        stats.observe(cls, profile, observation, model="mtp-demo")
    state = json.loads(stats.dumps())
    max_cell = next(c for c in state["cells"] if c["profile"] == "max")
    max_cell["decode"][1] = math.nan  # json writes NaN, as a broken sum would have
    text = json.dumps(state).encode()
    state_file.write_bytes(text)
    return text


def test_one_bad_cell_costs_that_cell_only_and_the_file_is_kept(tmp_path: Path) -> None:
    """A NaN in one cell once made the proxy refuse the whole file ("negative or non-finite
    number: starting empty") and its next save wrote the empty state over it."""
    state_file = tmp_path / "learned.json"
    original = good_and_poisoned(state_file)
    with running_proxy(config(state_file), tmp_path / "proxy") as proxy:
        assert learned(proxy) == {"off": 1, "min": 1}
        _, routing = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
        _, depths = proxy.get_json("/admin/depths", admin_key=ADMIN_KEY)
    rejected = Path(f"{state_file}.rejected")
    assert routing["state"] == f"loaded 2 cells, dropped 1 (1 untrusted; kept as {rejected})"
    assert depths["warnings"] == [
        f"the learned file {state_file} was not read whole: {routing['state']}"
    ]
    (warning,) = [
        line for line in proxy.log_lines() if line["event"] == "stats_state_cells_dropped"
    ]
    assert warning["level"] == "warning" and warning["dropped"][0].startswith(
        "cell mtp-demo/<4k/prose/max@0: ValueError: negative or non-finite number"
    )
    assert rejected.read_bytes() == original  # the file as it was, beside the new one
    assert set(saved_cells(state_file)) == {"off", "min"}  # saved at stop: not empty


def test_a_failed_save_is_counted_and_shown_in_status(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_file = state_dir / "learned.json"
    with running_proxy(config(state_file, save_interval_s=0.2), tmp_path / "proxy") as proxy:
        deadline = time.monotonic() + 10
        while not state_file.exists():  # saved once, then its directory goes
            assert time.monotonic() < deadline, proxy.tail()
            time.sleep(0.05)
        state_file.unlink()
        state_dir.rmdir()
        state_dir.write_text("a file where the directory was: every save fails now\n")
        while failures(proxy) < 2:
            assert time.monotonic() < deadline + 10, proxy.tail()
            time.sleep(0.1)
        _, depths = proxy.get_json("/admin/depths", admin_key=ADMIN_KEY)
        status = run_cli("status", "--url", proxy.url, "--admin-key", ADMIN_KEY)
    (warning,) = depths["warnings"]
    assert warning.startswith(f"the learned statistics could not be saved to {state_file} ")
    assert status.returncode == 0, status.stderr
    assert f"warning: {warning.split(' (last try')[0]}" in status.stdout


def failures(proxy: ProxyProcess) -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "mtp_proxy_state_save_failures":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no mtp_proxy_state_save_failures metric")


def test_check_config_refuses_a_state_file_the_services_user_cannot_write(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    conf = tmp_path / "config.toml"
    conf.write_text(tomli_w.dumps(config(state_dir / "learned.json")))
    assert run_cli("check-config", str(conf)).returncode == 0  # this user may
    unit = tmp_path / "mtp-proxy.service"
    unit.write_text(f"[Service]\nExecStart=/x/mtp-proxy serve --config {conf}\nUser=nobody\n")
    done = run_cli("check-config", str(conf), "--unit", str(unit))
    assert done.returncode == 2, done.stdout
    assert f"routing.learned_file {state_dir}/learned.json: the service's user nobody cannot " in (
        done.stderr
    )
    assert "; fix: chown nobody " in done.stderr

"""`mtp-proxy tune` end to end on the real llama-server with tiny qwen35 MTP models.

On stock llama-server one process per setting, on the patched build (scripts/build-llama-server.sh)
the depth per request in one process; through a running service on one process (`--url`) with
another client's traffic beside it; a config whose -c the server cannot hold; and `--apply`
followed by the reload that makes the service route `learned` from its first request.
"""

from __future__ import annotations

import json
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proxy.config.routing import RoutingSettings
from proxy.config.settings import Settings
from proxy.routing.stats import LearnedStats
from tests.support.harness import ADMIN_KEY, ProxyProcess, running_proxy, wait_all_ready
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.llama_pool import FAST_SUPERVISOR, MODEL, identity_model, llama_model
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35
from tests.support.tune_helpers import (
    by_class,
    document,
    profiles,
    results,
    run_tune,
    run_tune_url,
    write_config,
)

pytestmark = pytest.mark.llama

# Heavier than the tiny model (~600 MB), with the same MTP block that copies the trunk: reading
# its weights is most of a step, so verifying a few drafted tokens costs little more than one
# plain step, as on a GPU with a 27B model, and drafting wins by ~1.7x even on a busy CPU (the
# tiny model is so small that the MTP head's own pass is what costs, and drafting loses there).
HEAVY = Qwen35Config(
    mtp=Mtp.IDENTITY, bigram=True, n_layer=8, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64,
    n_ff=4096, ssm_state=64, ssm_groups=2, ssm_v_heads=16,
)  # fmt: skip
# One short chat, long enough a decode that a busy machine's swings average out.
GREETING = {"messages": [{"role": "user", "content": "Hi! How are you today?"}],
            "max_tokens": 192, "ignore_eos": True}  # fmt: skip
ONE_PROCESS_PROFILES: list[dict[str, Any]] = [
    {"name": "off"},
    {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2},
    {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
]


def _tiny_config(tmp_path: Path, ctx: int, *, patched: bool = True) -> Path:
    """A config of the tiny identity-MTP model (profile off only: tune brings the settings)."""
    model = llama_model(
        identity_model(tmp_path / "models"),
        profiles=[{"name": "off"}],
        args=["-c", str(ctx), "-np", "1", "-t", "1"],
    )
    if patched:
        model["binary"] = patched_llama_server_binary()
    return write_config(tmp_path, {"supervisor": FAST_SUPERVISOR, "models": [model]})


def test_tune_runs_end_to_end_one_process_per_setting(tmp_path: Path) -> None:
    config = _tiny_config(tmp_path, 2048, patched=False)
    out = tmp_path / "out"
    done = run_tune(
        config, out, "--settings", "off,1,2/1", "--repeats", "2", "--mode", "per-process",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tune: starting") == 3  # one process per setting, one at a time
    rows = results(out)
    # The tiny model's tokenizer spends ~1 character a token: tune measured it (/tokenize) and
    # sized the code prompt to the 2,048-token context, so nothing failed.
    assert document(out)["failures"] == []
    assert "failures" not in done.stdout
    assert {row["class"] for row in rows} == {"<4k/prose", "<4k/code"}
    for label in ("<4k/prose", "<4k/code"):
        cells = by_class(rows, label)
        assert set(cells) == {"off", "n1", "n2-m1"}
        assert cells["off"]["acceptance"] is None  # nothing drafted
        for name in ("n1", "n2-m1"):
            assert cells[name]["acceptance"] > 0.3, (label, name, cells[name])
            assert cells[name]["tok_s"] > 0 and cells[name]["repeats"] == 2
    found = profiles(out)
    assert found[0] == {"name": "off"}
    Settings(models=[{"name": "m", "backend": "simulator", "profiles": found}])
    stats = LearnedStats.load(out / "routing-state.json", RoutingSettings())
    assert stats.load_report.startswith("loaded"), stats.load_report


def test_tune_on_the_patched_build_varies_the_depth_in_one_process(tmp_path: Path) -> None:
    """The patched llama-server honours "speculative.n_max": the probe says so, and auto mode
    measures off, n_max 1 and n_max 2 as depths of one process started at n_max 2."""
    config = _tiny_config(tmp_path, 2048)
    out = tmp_path / "out"
    done = run_tune(config, out, "--settings", "off,1,2", "--repeats", "2", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("tune: starting") == 1
    assert "per request: off, n1, n2" in done.stderr
    drafted: dict[str, list[float]] = {}
    for name in ("off", "n1", "n2"):
        for line in (out / "settings" / f"{name}.jsonl").read_text().splitlines():
            m = json.loads(line)
            assert m["mode"] == "per-request"
            drafted.setdefault(name, []).append((m["draft_n"] or 0) / m["output_tokens"])
    # Depth 0 drafts nothing in a process started at n_max 2; depth 1 at most one per token.
    assert max(drafted["off"]) == 0
    assert 0 < max(drafted["n1"]) <= 1.0
    assert sum(drafted["n2"]) > sum(drafted["n1"])


def test_a_config_context_the_server_cannot_hold(tmp_path: Path) -> None:
    """-c 100000 on a model trained for 2,048 tokens: llama-server holds 2,048 per slot. Tune
    reads that from /props before sizing: what fits is measured, the eight classes that cannot
    fit are named with the reason (summary, results.json, profiles.toml), no request is sent to
    fail, and the exit code says the plan is incomplete."""
    config = _tiny_config(tmp_path, 100_000)
    out = tmp_path / "out"
    done = run_tune(config, out, "--settings", "off,1", "--repeats", "1", timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    assert (
        "context: 2,048 tokens per slot, from the server's /props (the config says -c 100,000)"
        in (done.stderr)
    )
    doc = document(out)
    assert {row["class"] for row in doc["rows"]} == {"<4k/prose", "<4k/code"}
    left = {item["class"]: item["reason"] for item in doc["left_out"]}
    beyond = {
        f"{b}/{k}" for b in ("4k-16k", "16k-32k", "32k-64k", "64k+") for k in ("code", "prose")
    }
    assert set(left) == beyond
    assert all("the server's context is 2,048 tokens per slot" in why for why in left.values())
    assert {item["class"] for item in doc["no_data"]} == beyond
    assert doc["failures"] == []  # left out before sending: not 490 requests failing
    assert "left out (the prompts do not fit the server's context):" in done.stdout
    assert "code, 64k+ tokens (64k+/code): needs over 65,536 prompt tokens" in done.stdout
    assert "incomplete (exit 3): 8 class(es) of the plan have no data" in done.stdout
    text = (out / "profiles.toml").read_text()
    assert text.count("# left out: ") == 8


def _chat(url: str, text: str, max_tokens: int = 24) -> tuple[int, dict[str, str]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens}  # fmt: skip
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        return response.status, dict(response.headers)


class Traffic:
    """Another client: chats sent one after another until stopped, each status kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                status, _ = _chat(self.url, f"Tell me about the river, part {n}.", 48)
            except urllib.error.HTTPError as exc:
                status = exc.code
                self.errors.append(exc.read().decode(errors="replace")[:300])
            except OSError as exc:
                status = -1
                self.errors.append(repr(exc))
            self.statuses.append(status)


def _service(
    tmp_path: Path, model_file: Path, *, slots: int, state: Path | None = None
) -> dict[str, Any]:
    model = llama_model(
        model_file,
        profiles=ONE_PROCESS_PROFILES,
        args=["-c", "2048", "-np", str(slots), "-t", "1"],
        draft_control="per-request",
    )
    model["binary"] = patched_llama_server_binary()
    return {
        # A loaded machine slows the other client's requests: they may wait past the default.
        "server": {"host": "127.0.0.1", "port": 0, "admin_key": ADMIN_KEY, "queue_timeout_s": 120},
        "log": {"level": "info", "format": "json"},
        "supervisor": FAST_SUPERVISOR,
        "routing": {"learned_file": str(state)} if state else {},
        "models": [model],
    }


def _backend(proxy: ProxyProcess) -> dict[str, Any]:
    status, body = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)
    assert status == 200, body
    rows: list[dict[str, Any]] = body["backends"]
    assert len(rows) == 1, rows
    return rows[0]


def test_tune_through_a_running_service_while_another_client_sends(tmp_path: Path) -> None:
    """--url: measured on the service's own process (no second copy, nothing restarted), the
    depth per request, n_min 1 listed as not measurable there; the other client is served
    throughout, and what decoded beside each measured request is recorded: the run says the
    box was busy and keeps those requests in cells of their load level."""
    config = _service(tmp_path, identity_model(tmp_path / "models"), slots=2)
    with running_proxy(config, tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        before = _backend(proxy)
        with Traffic(proxy.url) as traffic:
            while not traffic.statuses:  # the other client is under way before tune starts
                time.sleep(0.05)
            done = run_tune_url(
                proxy.url, ADMIN_KEY, tmp_path / "out", "--settings", "off,2,3/1", "--repeats", "2"
            )
        after = _backend(proxy)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    assert "processes: none started: the service's one-process" in done.stderr
    assert after["pid"] == before["pid"] and after["restarts"] == 0
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.errors
    doc = document(tmp_path / "out")
    assert doc["not_measurable"] == [
        {
            "setting": "n3-m1",
            "reason": "needs n_min 1 / p_min unset; the running process has n_min unset / p_min "
            "unset (only n_max is per request)",
        }
    ]
    measured = [
        json.loads(line)
        for name in ("off", "n2")
        for line in (tmp_path / "out" / "settings" / f"{name}.jsonl").read_text().splitlines()
    ]
    assert {m["mode"] for m in measured} == {"service"}
    assert {m["backend"] for m in measured} == {f"{MODEL}/one-process"}
    busy = [m for m in measured if m["others"] >= 0.5]
    assert busy, [m["others"] for m in measured]
    assert doc["run"]["busy"].startswith(f"{len(busy)} of {len(measured)} requests decoded beside")
    assert "busy: " in done.stdout
    levels = {row["level"] for row in doc["rows"]}
    assert 2 in levels, levels  # cells of the 2-3 decoding level
    # The drafts reached the service's process at each request's depth.
    assert all(not m["draft_n"] for m in measured if m["setting"] == "off")
    assert any(m["draft_n"] for m in measured if m["setting"] == "n2")


def test_apply_writes_the_service_config_and_state_and_the_reload_routes_learned(
    tmp_path: Path,
) -> None:
    """--url --apply on a model where drafting wins: the config gets the profiles named by
    their setting (backup kept), the learned file the service reads is seeded, the SIGHUP makes the
    service load both without restarting its process, and its first request is routed
    `learned`."""
    model_file = tmp_path / "heavy.gguf"
    write_qwen35(model_file, HEAVY)
    trace = tmp_path / "greeting.jsonl"
    record = {"at": 0.0, "session": None, "path": "/v1/chat/completions", "body": GREETING}
    trace.write_text(json.dumps(record) + "\n")
    state = tmp_path / "state" / "learned.json"
    config = _service(tmp_path, model_file, slots=1, state=state)
    with running_proxy(config, tmp_path / "proxy") as proxy:
        wait_all_ready(proxy, {MODEL: 1}, timeout=60)
        before = _backend(proxy)
        config_file = tmp_path / "proxy" / "config.toml"
        done = run_tune_url(
            proxy.url, ADMIN_KEY, tmp_path / "out", "--workload", str(trace),
            "--settings", "off,2", "--repeats", "4", "--apply", str(config_file),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        applied = [line for line in done.stdout.splitlines() if line.startswith("applied: ")]
        assert any("SIGHUP" in line for line in applied), applied
        assert applied[-1].startswith("applied: the service serves off, n2; learned state: loaded")
        status, headers = _chat(proxy.url, "Hi! How are you today?")
        after = _backend(proxy)
    assert status == 200
    assert headers["X-MTP-Route-Reason"].split(" ")[0] == "learned", headers
    assert headers["X-MTP-Profile"] in ("off", "n2")
    written = tomllib.loads(config_file.read_text())
    assert [p["name"] for p in written["models"][0]["profiles"]] == ["off", "n2"]
    assert written["models"][0]["draft_n_max"] == 3  # the process keeps its flags: not replaced
    assert written["routing"]["profile_max"] == "n2"
    assert len(list(config_file.parent.glob("config.toml.*.bak"))) == 1
    assert after["pid"] == before["pid"]
    stats = LearnedStats.load(state, RoutingSettings())
    trusted = {(r["class"], r["profile"]) for r in stats.table() if r["trusted"]}
    assert {("<4k/prose", "off"), ("<4k/prose", "n2")} <= trusted

"""The live page's side of the proxy, over HTTP against a real proxy on the simulator: its files
(/ui/), the admin reads it polls (/admin/requests, /admin/depths, /admin/chart), the busy-depth
metric, `mtp-proxy status` on a model served by one process. The page in a browser: tests/ui/."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.processes import start_proxy
from proxy.cli.status import render_status
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import Sent, body_for, send

MODEL = "mtp-demo"
BACKEND = "mtp-demo/one-process"
DEPTH = {"off": 0, "min": 2, "max": 3}
CLIENT_KEY = "sk-client-key"
CLIENT = {"Authorization": f"Bearer {CLIENT_KEY}"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """A model served by one process behind client API keys (the page's files need none)."""
    model = simulator_model(draft_control="per-request", time_scale=50.0, slots=4)
    config = proxy_config(
        [model], routing={"clock_scale": 50.0, "seed": 1}, server={"api_keys": [CLIENT_KEY]}
    )
    with running_proxy(config, tmp_path_factory.mktemp("live-endpoints")) as running:
        wait_all_ready(running, {MODEL: 1})
        yield running


@pytest.fixture(scope="module")
def sent(proxy: ProxyProcess) -> list[Sent]:
    answers = []
    for profile in ("off", "max", "min"):
        pin = {**CLIENT, "X-MTP-Profile": profile, "X-MTP-Session": "agent-1"}
        answers.append(send(proxy.url, "chat", body_for("chat", stream=False), headers=pin))
    for stream in (False, True):  # routed by the policy
        headers = {**CLIENT, "X-MTP-Session": "agent-1"}
        answers.append(send(proxy.url, "chat", body_for("chat", stream=stream), headers=headers))
    unknown = {**body_for("chat", stream=False), "model": "no-such-model"}
    answers.append(send(proxy.url, "chat", unknown, headers=CLIENT))
    answers.append(send(proxy.url, "chat", body_for("chat", stream=False)))  # no key: 401
    return answers


def get(proxy: ProxyProcess, path: str, key: str | None = ADMIN_KEY) -> tuple[int, Any]:
    return proxy.get_json(path, admin_key=key)


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_recent_requests_are_the_requests_sent(proxy: ProxyProcess, sent: list[Sent]) -> None:
    status, answer = get(proxy, "/admin/requests")
    assert status == 200, answer
    rows = {row["request_id"]: row for row in answer["requests"]}
    assert [r["seq"] for r in answer["requests"]] == sorted(r["seq"] for r in answer["requests"])
    assert answer["last"] == answer["requests"][-1]["seq"]
    for request in (s for s in sent if s.routed):
        row = rows[request.request_id]
        assert (row["api"], row["model"], row["status"]) == ("chat", MODEL, 200)
        assert (row["profile"], row["depth"]) == (request.profile, DEPTH[request.profile])
        assert row["reason"] == request.reason and row["detail"]
        assert (row["output_tokens"], row["prompt_tokens"]) == (
            request.output_tokens,
            request.context_tokens,
        )
        assert (row["drafted"] or 0, row["accepted"] or 0) == (
            request.draft_n,
            request.draft_accepted,
        )
        assert row["decode_tok_s"] > 0 and row["backend"] == BACKEND
        assert row["session"] == "agent-1" and row["stream"] == request.stream
    (refused,) = [s for s in sent if s.status == 404]
    row = rows[refused.request_id]
    assert (row["status"], row["profile"], row["depth"]) == (404, None, None)
    assert "'no-such-model'" in row["error"]
    # A request without the client key is not the proxy's client: not listed.
    unauthorized = [s for s in sent if s.status == 401]
    assert unauthorized and unauthorized[0].request_id not in rows


def test_recent_requests_after_a_sequence_number(proxy: ProxyProcess, sent: list[Sent]) -> None:
    _, everything = get(proxy, "/admin/requests")
    seqs = [row["seq"] for row in everything["requests"]]
    _, later = get(proxy, f"/admin/requests?after={seqs[1]}")
    assert [row["seq"] for row in later["requests"]] == seqs[2:]
    _, newest = get(proxy, "/admin/requests?limit=2")
    assert [row["seq"] for row in newest["requests"]] == seqs[-2:]
    for bad in ("-1", "x", "1e3", "9" * 40):
        status, answer = get(proxy, f"/admin/requests?after={bad}")
        assert status == 400 and "non-negative integer" in answer["error"]["message"], bad


def test_every_live_read_needs_the_admin_key(proxy: ProxyProcess) -> None:
    for path in ("/admin/requests", "/admin/depths", "/admin/chart"):
        for key in (None, "wrong-key", CLIENT_KEY):
            status, answer = get(proxy, path, key)
            assert status == 401 and "admin key" in answer["error"]["message"], (path, key)


def test_depth_now_is_the_busy_epoch_and_the_last_request(
    proxy: ProxyProcess, sent: list[Sent]
) -> None:
    status, answer = get(proxy, "/admin/depths")
    assert status == 200
    assert answer["profiles"] == {MODEL: DEPTH}
    (row,) = answer["backends"]
    assert (row["name"], row["model"], row["shape"]) == (BACKEND, MODEL, "one-process")
    _, routing = get(proxy, "/admin/routing")
    epoch = routing["busy"][BACKEND]
    assert row["busy"]["profile"] == epoch["profile"]
    assert row["busy"]["depth"] == DEPTH[epoch["profile"]]
    assert row["busy"]["left"] == epoch["left"]
    last = [s for s in sent if s.routed][-1]
    assert row["last"]["request_id"] == last.request_id
    assert row["last"]["depth"] == DEPTH[last.profile]
    assert (row["decoding"], row["depth"], row["now"]) == ([], None, "idle")  # idle now
    assert row["why"].startswith("idle")
    # Idle, the depth it runs now is its last request's: an answer however busy it was.
    now = row["depth_now"]
    assert (now["depth"], now["source"], now["profile"]) == (
        DEPTH[last.profile],
        "last",
        last.profile,
    )
    assert now["at"] == row["last"]["at"]


def test_depth_now_while_a_request_decodes(proxy: ProxyProcess, sent: list[Sent]) -> None:
    body = {**body_for("chat", stream=True, max_tokens=4000), "ignore_eos": True}
    client = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        headers = {**CLIENT, "X-MTP-Profile": "min", "Content-Type": "application/json"}
        client.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = client.getresponse()
        assert response.status == 200 and response.read(64)  # its first tokens: decoding
        _, answer = get(proxy, "/admin/depths")
    finally:
        client.close()
    (row,) = answer["backends"]
    assert row["decoding"] == [{"profile": "min", "depth": 2, "requests": 1}]
    assert (row["depth"], row["now"]) == (2, "2") and "1 decoding" in row["why"]
    assert row["depth_now"] == {"depth": 2, "source": "decoding", "profile": "min", "at": None}


def test_depth_now_while_a_request_processes_its_prompt(
    proxy: ProxyProcess, sent: list[Sent]
) -> None:
    """A request that has not yet decoded a token holds a slot: the process is not idle."""
    long = "the build step copies the cache entry and checks its hash. " * 2500  # ~30k tokens
    body = {**body_for("chat", stream=True, max_tokens=4000), "ignore_eos": True, "messages": [
        {"role": "user", "content": long}]}  # fmt: skip
    client = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    try:
        headers = {**CLIENT, "X-MTP-Profile": "min", "Content-Type": "application/json"}
        client.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        seen = None
        deadline = time.monotonic() + 30
        while seen is None and time.monotonic() < deadline:
            _, answer = get(proxy, "/admin/depths")
            (row,) = answer["backends"]
            if row["in_flight"] == 1 and not row["decoding"]:
                seen = row  # in flight, no token decoded yet: its prompt is being processed
    finally:
        client.close()  # cut long before its end, as above: the chart counts answered requests
    assert seen is not None, "the request was never seen processing its prompt"
    assert (seen["depth"], seen["now"]) == (None, "prompt")
    assert seen["why"] == "1 request processing its prompt", seen
    # `mtp-proxy status` shows it so too, in its "depth now" column.
    table = render_status(proxy.url, [], {}, [seen]).splitlines()
    (shown,) = [line for line in table if line.startswith(BACKEND)]
    assert shown.split()[1] == "prompt", shown


def test_busy_depth_metric_is_the_epochs_depth(proxy: ProxyProcess, sent: list[Sent]) -> None:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_busy_depth"
    ]
    _, answer = get(proxy, "/admin/depths")
    (row,) = answer["backends"]
    assert [(s.labels, s.value) for s in samples] == [
        ({"backend": BACKEND, "model": MODEL}, float(row["busy"]["depth"]))
    ]
    # The depth now, as the page's card says it: the last request's, idle.
    now = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_backend_depth"
    ]
    labels = {"backend": BACKEND, "model": MODEL, "source": "last"}
    assert now == [(labels, float(row["depth_now"]["depth"]))]


def test_drafting_verdict_is_the_calibration_load_by_load(
    proxy: ProxyProcess, sent: list[Sent]
) -> None:
    """Whether drafting pays, before anything was learned at a load: the start-up
    calibration's speeds at depth 0 and the deepest, both of one load, their ratio, its
    verdict; the learned comparisons beside each are of that same load only."""
    status, answer = get(proxy, "/admin/drafting")
    assert status == 200
    (row,) = answer["backends"]
    assert (row["backend"], row["model"], row["deepest"]) == (BACKEND, MODEL, 3)
    _, routing = get(proxy, "/admin/routing")
    cells = {(c["load"], c["depth"]): c["tok_s"] for c in routing["calibration"][BACKEND]["cells"]}
    assert [level["measured_load"] for level in row["levels"]] == [1, 2, 4]
    assert [level["words"] for level in row["levels"]] == ["alone", "2-3 decoding", "4+ decoding"]
    for level in row["levels"]:
        load = level["measured_load"]
        assert (level["off_tok_s"], level["deep_tok_s"]) == (cells[load, 0], cells[load, 3])
        assert level["ratio"] == pytest.approx(cells[load, 3] / cells[load, 0], abs=1e-3)
        assert level["pays"] == (level["ratio"] > 1)
        said = "drafting pays" if level["pays"] else "off wins"
        assert f"{level['words']}, {said}: depth 3 decodes {level['ratio']:.2f}x" in row["verdict"]
        for learned in level["learned"]:  # off and a depth of one class at this level
            assert learned["profile"] in ("min", "max") and learned["speedup"] > 0
    # off and max were each sent alone, one after the other: learned at load 1, beside it.
    (alone,) = [level for level in row["levels"] if level["level"] == 1]
    assert {learned["profile"] for learned in alone["learned"]} >= {"max"}


def test_chart_has_a_line_per_depth_that_served(proxy: ProxyProcess, sent: list[Sent]) -> None:
    _, chart = get(proxy, "/admin/chart")
    assert chart["step_s"] == 10 and chart["window_s"] == 900
    served = {s.profile for s in sent if s.routed}
    assert {line["profile"] for line in chart["lines"]} == served
    for profile in served:
        lines = [line for line in chart["lines"] if line["profile"] == profile]
        # One line per load level it was measured at: never alone and busy as one line.
        assert len({line["level"] for line in lines}) == len(lines) and lines
        assert all(line["level"] >= 1 for line in lines)  # one process: a level each
        for line in lines:
            assert (line["model"], line["depth"]) == (MODEL, DEPTH[profile])
        points = [p for line in lines for p in line["points"]]
        assert sum(p["requests"] for p in points) == sum(
            1 for s in sent if s.routed and s.profile == profile
        )
        drafting = [p["acceptance"] for p in points if p["acceptance"] is not None]
        assert bool(drafting) == (DEPTH[profile] > 0)


def test_the_page_files_are_served_without_any_key(proxy: ProxyProcess) -> None:
    status, headers, body = fetch(proxy.url + "/ui/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'<script src="app.js"' in body and b"MTP_PROXY_SERVER__ADMIN_KEY" in body
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        status, headers, body = fetch(f"{proxy.url}/ui/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    status, headers, _ = fetch(proxy.url + "/ui/icon.svg")
    assert status == 200 and headers["Content-Type"].startswith("image/svg+xml")
    for missing in ("/ui/nothing.js", "/ui/..%2fapp.py", "/ui/index.html"):
        assert fetch(proxy.url + missing)[0] == 404, missing
    # /ui redirects to /ui/ (relative addresses in the page resolve against the slash).
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        connection.request("GET", "/ui")
        response = connection.getresponse()
        assert (response.status, response.getheader("Location")) == (308, "/ui/")
    finally:
        connection.close()


def test_the_page_holds_no_data_and_its_script_sends_the_key_as_a_header(
    proxy: ProxyProcess,
) -> None:
    _, _, script = fetch(proxy.url + "/ui/app.js")
    text = script.decode()
    assert 'Authorization: "Bearer " + page.key' in text
    assert "location.hash" in text and "location.search" not in text
    _, _, page = fetch(proxy.url + "/ui/")
    assert ADMIN_KEY.encode() not in page and b"mtp-demo" not in page


def test_the_pages_polls_are_not_logged_at_info(proxy: ProxyProcess, sent: list[Sent]) -> None:
    marker = "/admin/requests?after=0&limit=7"
    for _ in range(3):
        assert get(proxy, marker)[0] == 200
    assert get(proxy, marker, "wrong-key")[0] == 401

    def logged() -> list[int]:  # the lines are written a moment after the answers
        return [line["status"] for line in proxy.log_lines() if line.get("path") == marker]

    deadline = time.monotonic() + 10
    while 401 not in logged() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logged() == [401]  # only the refusal, at info


def test_the_live_page_address_is_logged_at_start(proxy: ProxyProcess) -> None:
    (line,) = [line for line in proxy.log_lines() if line.get("event") == "live_page"]
    assert line["url"] == f"http://127.0.0.1:{proxy.port}/ui/#key=ADMIN_KEY"
    assert line["admin_key_set"] is True


def test_status_shows_the_depth_each_process_runs(proxy: ProxyProcess, sent: list[Sent]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "status", "--url", proxy.url, "--admin-key", ADMIN_KEY],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("Depth per process (now, and why)")
    header, row = lines[start + 1], lines[start + 3]
    assert header.split()[:3] == ["backend", "depth", "now"]
    _, answer = get(proxy, "/admin/depths")
    (depths,) = answer["backends"]
    epoch = depths["busy"]
    assert row.startswith(BACKEND) and " idle " in row
    assert f"{epoch['profile']} (depth {epoch['depth']}), {epoch['left']} left" in row
    last = depths["last"]
    assert f"{last['profile']} (depth {last['depth']}), {last['reason']}" in row


def test_the_page_can_be_turned_off(tmp_path: Path) -> None:
    never_ready = {
        "name": "x",
        "backend": "simulator",
        "profiles": [{"name": "p", "url": "http://127.0.0.1:9"}],
    }
    config = proxy_config([never_ready])
    config["ui"] = {"enabled": False}
    proxy = start_proxy(config, tmp_path, wait=False)
    try:
        for path in ("/ui/", "/ui/app.js", "/ui"):
            assert fetch(proxy.url + path)[0] == 404, path
        assert not [line for line in proxy.log_lines() if line.get("event") == "live_page"]
    finally:
        proxy.stop()

"""The shipped observability, live: the real Prometheus scrapes a running proxy under mixed traffic.

Prometheus (Debian's `prometheus` package, scripts/install-tools.sh) runs with the shipped
deploy/prometheus/prometheus.yml and alerts.yml: only the target (this proxy's port) and the
intervals (1 s instead of 15 s, so the test takes seconds) are changed. The proxy serves three
models: `mtp-demo` (a pool of simulated off/min/max plus `bad`,
tests/support/misbehaving_backend.py, which fails on request), `fragile` (the misbehaving
backend alone, so its failures have no retry) and `agent` (one simulated process, the depth per
request: busy epochs, learned speeds per load level) and `solo` (one simulated process with one
slot, as `mtp-proxy init` writes for one GPU: never busy, so only the depth now answers there).

Traffic over several scrapes: every API, stream or not, pinned to each profile and unpinned,
client errors, a 502, a retried failure, a stream cut mid-way, bursts of concurrent requests on
the one process, a backend killed and restarted and one frozen past its health-check timeout.
Then every query of deploy/grafana/mtp-proxy.json, template variables at "All" and at one model
and profile, is evaluated through /api/v1/query and must parse and return data, or be listed in
EMPTY_BY_DESIGN with the reason it shows nothing here; every alert rule must have been evaluated
without error (/api/v1/rules).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
from tests.support.misbehaving_backend import running_backend
from tests.support.traffic import UNROUTED, body_for, send, wait_all_ready

yaml: Any = importlib.import_module("yaml")  # no type stubs; plain dicts and lists here

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "mtp-proxy.json"
SCRAPE_S = 1
ROUNDS = 5  # of traffic, about one scrape apart: every counter moves between two scrapes
# Grafana's own variables, as Grafana would expand them for a dashboard over the last minutes
# at a 1 s scrape interval; the template variables at "All" (their allValue).
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__interval": "1s", "$__range": "5m"}
ALL = ".*"
# The variables at "All" (the dashboard's default), at one model and profile, and at each value
# the profile variable lists: a panel filtering on a label its metric lacks still shows data at
# "All" (`.*` matches the empty string), not once a value is picked; a backend panel filtering
# on the profile went empty once one was picked, the one-process backends being "one-process".
PROFILE_VALUES = ("off", "min", "max", "bad")
SELECTIONS = {  # box: this one proxy (several boxes: tests/boxes/test_prometheus_boxes.py)
    "All": {"model": ALL, "profile": ALL, "box": ALL},
    "one": {"model": "mtp-demo", "profile": "max", "box": ALL},
    **{f"profile {p}": {"model": ALL, "profile": p, "box": ALL} for p in PROFILE_VALUES},
}
# Panel queries (selection, panel title, refId) that legitimately show nothing under this
# traffic, with the reason.
EMPTY_BY_DESIGN: dict[tuple[str, str, str], str] = {
    ("one", "Error ratio (5xx share)", "A"): "mtp-demo had no 5xx: its failures were retried "
    "or cut mid-stream (status 200); the 502s were fragile's",
    ("All", "Restarts and crash loops", "B"): "no backend crash-looped (one kill, 5 needed)",
    ("one", "Restarts and crash loops", "B"): "no backend crash-looped (one kill, 5 needed)",
    ("one", "Depth each process runs now", "B"): "mtp-demo is a pool: one depth per process, "
    "no busy epochs (agent's are shown at All)",
    **{
        ("one", "Does drafting pay? Start-up calibration", ref): "mtp-demo is a pool: no "
        "start-up calibration (agent's and solo's are shown at All)"
        for ref in "ABCD"
    },
    ("one", "Health-check failures", "A"): "the backend frozen past its health check is "
    "agent's, not mtp-demo's",
    ("one", "Upstream retries and stream failures", "B"): "the streams cut mid-way were "
    "profile bad's, not max's",
}
# Per profile value: what legitimately shows nothing at it, and why.
EMPTY_AT_PROFILE: dict[tuple[str, str, str], str] = {
    **{
        (f"profile {p}", title, ref): "a profile that drafts nothing: off never drafts, bad is "
        "the misbehaving backend (no timings, no draft counts)"
        for p in ("off", "bad")
        for title, refs in {
            "Draft acceptance by profile": "A",
            "Drafted and accepted tokens/s": "AB",
            "Draft acceptance by profile and request class": "A",
        }.items()
        for ref in refs
    },
    ("profile off", "Learned routing table", "B"): "off never drafts: no acceptance learned",
    ("profile off", "Speedup against off (learned)", "A"): "off against itself is no speedup",
    ("profile off", "Speedup against off (learned)", "B"): "off against itself is no speedup",
    **{
        (f"profile {p}", "Upstream retries and stream failures", "B"): "only bad's streams "
        "were cut mid-way"
        for p in ("off", "min", "max")
    },
    **{
        (f"profile {p}", "Restarts and crash loops", "A"): "only mtp-demo/max was killed and "
        "restarted; the one-process backends never restarted"
        for p in ("off", "min", "bad")
    },
    **{
        (f"profile {p}", "Restarts and crash loops", "B"): "no backend crash-looped (one kill, "
        "5 needed)"
        for p in PROFILE_VALUES
    },
    **{
        ("profile bad", title, ref): "the misbehaving backend answers without usage or timings: "
        "no tokens, no decode speed; what it taught is samples without a speed"
        for title, refs in {
            "Output tokens/s": "A",
            "Context tokens p50 / p95 by profile": "AB",
            "Decode speed by profile and load level": "AB",
            "Speedup against off (learned)": "A",
            "Learned routing table": "AB",
        }.items()
        for ref in refs
    },
}
EMPTY_BY_DESIGN.update(EMPTY_AT_PROFILE)
DRAFTING = {"min", "max"}
AGENT = "agent"  # the model served by one process
SOLO = "solo"  # one process with one slot (-np 1, what init writes on one GPU): never busy
SERVED = {"off", "min", "max"}


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    at: float | None = None
    """Evaluation time of the dashboard queries (unix s): right after the traffic, as a
    dashboard viewed then would show it, however long the test takes to ask."""

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:
            answer = json.loads(error.read())
        assert answer["status"] == "success", (params, answer)
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        at = {} if self.at is None else {"time": f"{self.at:.3f}"}
        data = self.api("/api/v1/query", query=expr, **at)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result


def prometheus_config(directory: Path, proxy_port: int, *more: int) -> Path:
    """The shipped scrape config, pointed at this proxy (and `more`: tests/boxes), at a 1 s
    interval."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    interval = f"{SCRAPE_S}s"
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job.update(scrape_interval=interval, scrape_timeout=interval)
    job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in (proxy_port, *more)]}]
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_prometheus(directory: Path, proxy_port: int, *more: int) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run scripts/install-tools.sh (as root) first")
    port = free_port()
    argv = [
        binary,
        f"--config.file={prometheus_config(directory, proxy_port, *more)}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    log = (directory / "prometheus.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Prometheus(process, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, (directory / "prometheus.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(server.url + "/-/ready", timeout=1) as response:
                if response.status == 200:
                    return server
        except OSError:
            time.sleep(0.1)
    stop_prometheus(server)
    raise TimeoutError("prometheus not ready within 30 s")


def stop_prometheus(server: Prometheus) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def wait_until(what: str, condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)


def backends(proxy: ProxyProcess) -> dict[str, dict[str, Any]]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return {row["name"]: row for row in rows}


def one_round(proxy: ProxyProcess) -> list[tuple[str, int]]:
    """One round of the mix; (what, status) of each request."""
    url = proxy.url
    outcomes = []
    for profile in sorted(SERVED):
        pin = {"X-MTP-Profile": profile}
        for api in ("chat", "completions"):
            for stream in (False, True):
                sent = send(url, api, body_for(api, stream=stream), headers=pin)
                outcomes.append((f"{api} pinned {profile}", sent.status))
    for api in ("chat", "completions", "responses", "messages"):  # unpinned: routed
        for stream in (False, True):
            sent = send(url, api, body_for(api, stream=stream))
            outcomes.append((f"{api} stream={stream}", sent.status))
    missing = {**body_for("chat", stream=False), "model": "no-such-model"}
    outcomes.append(("unknown model", send(url, "chat", missing).status))
    outcomes.append(("not JSON", send(url, "chat", None, raw=b"[1, 2").status))
    fail = {"X-Misbehave": "close-before-headers"}
    fragile = {**body_for("chat", stream=False), "model": "fragile"}
    outcomes.append(("fragile, no retry", send(url, "chat", fragile, headers=fail).status))
    retried = {"X-MTP-Profile": "bad", **fail}
    outcomes.append(
        ("retried", send(url, "chat", body_for("chat", stream=False), headers=retried).status)
    )
    cut = {"X-MTP-Profile": "bad", "X-Misbehave": "close-after-chunks:2"}
    outcomes.append(
        ("cut mid-stream", send(url, "chat", body_for("chat", stream=True), headers=cut).status)
    )
    return outcomes


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, ProxyProcess]]:
    workdir = tmp_path_factory.mktemp("prometheus-live")
    with running_backend("ok", "--chunks", "3") as bad_url:
        demo = simulator_model(
            time_scale=50.0,
            profiles=[
                {"name": "off"},
                {"name": "min", "spec_type": "draft-mtp", "draft_n_max": 2, "draft_n_min": 1},
                {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3},
                {"name": "bad", "url": bad_url},
            ],
        )
        fragile = {
            "name": "fragile",
            "backend": "simulator",
            "profiles": [{"name": "bad", "url": bad_url}],
        }
        agent = simulator_model(AGENT, draft_control="per-request", time_scale=50.0)
        solo = simulator_model(SOLO, draft_control="per-request", time_scale=50.0, slots=1)
        routing = {"clock_scale": 50.0, "exploration_rate": 0.0, "cold_exploration_rate": 0.0}
        config = proxy_config(
            [demo, fragile, agent, solo],
            routing=routing,
            server={"first_byte_timeout_s": 2},
            supervisor={"health_timeout_s": 0.5},
        )
        with running_proxy(config, workdir / "proxy") as proxy:
            wait_all_ready(proxy)
            prometheus = start_prometheus(workdir, proxy.port)
            try:
                wait_until(
                    "the proxy scraped", lambda: prometheus.query('up{job="mtp-proxy"} == 1')
                )
                drive(proxy)
                settle(prometheus, proxy)
                yield prometheus, proxy
            finally:
                stop_prometheus(prometheus)


def settle(prometheus: Prometheus, proxy: ProxyProcess) -> None:
    """Wait until Prometheus has scraped the proxy's final counts and evaluated every rule
    after that."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()  # /metrics flushes the deferred bookkeeping first
    total = sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_requests_total"
    )

    def scraped_total() -> bool:
        result = prometheus.query("sum(mtp_proxy_requests_total)")
        return bool(result) and float(result[0]["value"][1]) == total

    wait_until(f"Prometheus scraped {total} requests", scraped_total)
    seen_at = datetime.now(UTC)
    prometheus.at = seen_at.timestamp()

    def evaluated_since() -> bool:
        groups = prometheus.api("/api/v1/rules")["groups"]
        return all(datetime.fromisoformat(group["lastEvaluation"]) > seen_at for group in groups)

    wait_until("every rule group evaluated on them", evaluated_since)


def kill_and_wait_restarted(proxy: ProxyProcess, name: str) -> None:
    killed = backends(proxy)[name]["pid"]
    os.kill(killed, signal.SIGKILL)

    def restarted() -> bool:  # a new process: the old one's "ready" may not have changed yet
        row = backends(proxy)[name]
        return row["state"] == "ready" and row["pid"] not in (None, killed)

    wait_until(f"{name} restarted", restarted)


def freeze_past_a_health_check(proxy: ProxyProcess, name: str) -> None:
    """SIGSTOP a backend until a health check of it failed (a hung llama-server), then let it
    go on: a failure to count, well before it would be taken out of rotation."""
    pid = backends(proxy)[name]["pid"]
    before = backends(proxy)[name]["health_failures"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            f"{name} failed a health check",
            lambda: backends(proxy)[name]["health_failures"] > before,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(f"{name} ready", lambda: backends(proxy)[name]["state"] == "ready")


def agent_burst(proxy: ProxyProcess, size: int = 4) -> list[tuple[str, int]]:
    """Requests decoding together on the one process: a busy epoch's depth, load levels."""
    body = {**body_for("chat", stream=True), "model": AGENT, "max_tokens": 48}
    with ThreadPoolExecutor(size) as pool:
        sent = list(pool.map(lambda _: send(proxy.url, "chat", body), range(size)))
    alone = [  # one after another: learned side by side, each depth at the same load level
        send(proxy.url, "chat", {**body_for("chat", stream=False), "model": AGENT}, headers=pin)
        for pin in ({}, {"X-MTP-Profile": "off"}, {"X-MTP-Profile": "max"})
    ]
    solo = [  # one at a time: its only slot
        send(proxy.url, "chat", {**body_for("chat", stream=stream), "model": SOLO})
        for stream in (False, True)
    ]
    return [("agent", s.status) for s in [*sent, *alone, *solo]]


def drive(proxy: ProxyProcess) -> None:
    statuses: dict[str, set[int]] = {}
    for i in range(ROUNDS):
        started = time.monotonic()
        if i == 1:  # a backend dies once: a restart to count, a state change to show
            kill_and_wait_restarted(proxy, "mtp-demo/max")
        if i == 2:
            freeze_past_a_health_check(proxy, f"{AGENT}/one-process")
        for what, status in [*one_round(proxy), *agent_burst(proxy)]:
            statuses.setdefault(what, set()).add(status)
        time.sleep(max(0.0, SCRAPE_S - (time.monotonic() - started)))
    # The mix is what it says: served, refused and failed as intended.
    assert statuses["unknown model"] == {404} and statuses["not JSON"] == {400}
    assert statuses["fragile, no retry"] == {502} and statuses["retried"] == {200}
    assert statuses["cut mid-stream"] == {200} and statuses["agent"] == {200}
    assert {
        s
        for what, codes in statuses.items()
        if "stream=" in what or "pinned" in what
        for s in codes
    } == {200}


def dashboard_queries(selection: str) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every panel target, variables expanded as Grafana would:
    the query variables at the selection, a text box at its default."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == set(SELECTIONS[selection])
    assert all(v["includeAll"] and v["allValue"] == ALL for v in variables.values())
    values = dict(SELECTIONS[selection])
    values.update(
        (v["name"], v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "textbox"
    )
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            for name, value in values.items():
                expr = re.sub(rf"\$\{{?{name}\}}?\b", value, expr)
            assert "$" not in expr, f"unexpanded variable in {panel['title']!r}: {expr}"
            queries.append((panel["title"], target["refId"], expr))
    return queries


QUERIES = [(title, expr) for title, _, expr in dashboard_queries("All")]
CASES = [(selection, *query) for selection in SELECTIONS for query in dashboard_queries(selection)]


def test_every_empty_panel_listed_is_one_of_the_dashboard() -> None:
    listed = {(selection, title, ref) for selection, title, ref, _ in CASES}
    assert set(EMPTY_BY_DESIGN) <= listed, set(EMPTY_BY_DESIGN) - listed


@pytest.mark.parametrize(
    ("selection", "title", "ref", "expr"),
    CASES,
    ids=[f"{s}:{t}:{r}:{e[:40]}" for s, t, r, e in CASES],
)
def test_every_dashboard_query_returns_data(
    scraped: tuple[Prometheus, ProxyProcess], selection: str, title: str, ref: str, expr: str
) -> None:
    prometheus, _ = scraped
    result = prometheus.query(expr)  # a query that does not parse fails in Prometheus.api
    if (selection, title, ref) in EMPTY_BY_DESIGN:
        reason = EMPTY_BY_DESIGN[selection, title, ref]
        assert result == [], f"listed as empty ({reason}) but returns data"
        return
    assert result, f"{title!r} shows nothing: {expr}"
    values = [float(sample["value"][1]) for sample in result]
    assert any(math.isfinite(v) for v in values), f"{title!r}: only NaN/Inf: {result}"


def labels_of(prometheus: Prometheus, expr: str, label: str) -> set[str]:
    return {
        s["metric"][label] for s in prometheus.query(expr) if math.isfinite(float(s["value"][1]))
    }


def panel_exprs(title: str) -> list[str]:
    return [expr for t, expr in QUERIES if t == title]


def test_mtp_panels_show_the_profiles_that_served(
    scraped: tuple[Prometheus, ProxyProcess],
) -> None:
    prometheus, _ = scraped
    (acceptance,) = panel_exprs("Draft acceptance by profile")
    assert labels_of(prometheus, acceptance, "profile") == DRAFTING, prometheus.query(acceptance)
    (by_class,) = panel_exprs("Draft acceptance by profile and request class")
    assert labels_of(prometheus, by_class, "profile") == DRAFTING, prometheus.query(by_class)
    for expr in panel_exprs("Decode speed by profile and load level"):
        assert labels_of(prometheus, expr, "profile") >= SERVED
    (mix,) = panel_exprs("Routing mix by reason and profile")
    routed = {(s["metric"]["reason"], s["metric"]["profile"]) for s in prometheus.query(mix)}
    assert {("pinned", p) for p in SERVED} <= routed
    assert any(reason in ("rule", "learned") for reason, _ in routed)
    for expr in panel_exprs("Learned routing table"):
        profiles = labels_of(prometheus, expr, "profile")
        # No acceptance series for a profile that never drafts (off): not NaN, absent.
        assert profiles == DRAFTING if "acceptance" in expr else profiles >= SERVED, (
            expr,
            prometheus.query(expr),
        )
    # Acceptance is a ratio, and the identity of the profiles is what the proxy served.
    for sample in prometheus.query(acceptance):
        assert 0.0 < float(sample["value"][1]) <= 1.0, sample


def test_every_alert_rule_evaluates_without_error(
    scraped: tuple[Prometheus, ProxyProcess],
) -> None:
    prometheus, _ = scraped
    shipped = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())["groups"]
    expected = {rule["alert"] for group in shipped for rule in group["rules"]}
    rules = [rule for group in prometheus.api("/api/v1/rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == expected
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert not rule["lastEvaluation"].startswith("0001"), f"{rule['name']} never evaluated"
    firing = {rule["name"] for rule in rules if rule["state"] != "inactive"}
    assert firing <= {"MtpProxyHighErrorRatio"}, firing  # only the 502s could raise one


def test_backend_panels_keep_the_one_process_backends_at_each_profile(
    scraped: tuple[Prometheus, ProxyProcess],
) -> None:
    """A one-process backend serves every profile (its label is "one-process"): choosing a profile
    keeps it in the backend panels, beside the pool processes of that profile."""
    prometheus, _ = scraped
    for profile in PROFILE_VALUES:
        queries = dashboard_queries(f"profile {profile}")
        (in_flight,) = [
            expr for title, _, expr in queries if title == "In-flight requests by backend"
        ]
        shown = labels_of(prometheus, in_flight, "backend")
        assert {f"{AGENT}/one-process", f"{SOLO}/one-process"} <= shown, (profile, shown)
        pool = {"mtp-demo/bad", "fragile/bad"} if profile == "bad" else {f"mtp-demo/{profile}"}
        assert shown - {f"{AGENT}/one-process", f"{SOLO}/one-process"} == pool, (profile, shown)


def test_unrouted_requests_are_counted_apart(scraped: tuple[Prometheus, ProxyProcess]) -> None:
    prometheus, _ = scraped
    refused = prometheus.query(
        f'sum by (status) (mtp_proxy_requests_total{{profile="{UNROUTED}"}})'
    )
    assert {s["metric"]["status"] for s in refused} >= {"400", "404"}


def test_the_variables_list_what_served_requests(scraped: tuple[Prometheus, ProxyProcess]) -> None:
    """As Grafana's label_values() lists them: the models, and the profiles that served, which
    for the model served by one process are its depths, not its process's name."""
    prometheus, _ = scraped
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    found = {}
    for variable in (v for v in variables if v["type"] == "query"):
        match = re.fullmatch(r"label_values\((\w+\{[^}]*\}), *(\w+)\)", variable["query"]["query"])
        assert match, variable["query"]["query"]
        selector = match.group(1).replace("$model", ALL)
        found[variable["name"]] = labels_of(
            prometheus, f"group by ({match.group(2)}) ({selector})", match.group(2)
        )
    assert found["model"] == {"mtp-demo", "fragile", AGENT, SOLO}
    assert found["profile"] == set(PROFILE_VALUES)  # each is a selection of the panels above


def test_the_mtp_questions_are_answered(scraped: tuple[Prometheus, ProxyProcess]) -> None:
    prometheus, proxy = scraped
    # Which depth each process runs now: the request decoding or the last one, on every
    # backend, the one-slot process included; as the live page's feed says.
    now, beside_others = panel_exprs("Depth each process runs now")
    depths = proxy.get_json("/admin/depths", admin_key=ADMIN_KEY)[1]
    expected = {
        b["name"]: float(b["depth_now"]["depth"]) for b in depths["backends"] if b["depth_now"]
    }
    shown = {s["metric"]["backend"]: float(s["value"][1]) for s in prometheus.query(now)}
    assert shown == expected, (shown, expected)
    assert f"{SOLO}/one-process" in shown and f"{AGENT}/one-process" in shown
    assert shown["mtp-demo/max"] == 3.0 and shown["mtp-demo/off"] == 0.0  # a pool's profiles
    # ... and beside others on the busy process: its busy epoch's, as the proxy says.
    epochs = {b["name"]: b["busy"]["depth"] for b in depths["backends"] if b["busy"]}
    shown = {s["metric"]["backend"]: float(s["value"][1]) for s in prometheus.query(beside_others)}
    assert shown == {name: float(depth) for name, depth in epochs.items()}
    assert set(shown) == {f"{AGENT}/one-process"}
    # Whether drafting pays: each drafting profile's learned speed over off's, class by class.
    speedup, _ = panel_exprs("Speedup against off (learned)")
    learned = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["learned"]
    speed = {
        (r["model"], r["request_class"], r["load_level"], r["profile"]): r["decode_tok_s"]
        for r in learned
    }
    rows = prometheus.query(speedup)
    assert {s["metric"]["profile"] for s in rows} == DRAFTING
    assert {s["metric"]["model"] for s in rows} == {"mtp-demo", AGENT}
    # One class format; the load each side was measured at in its own label, the same for both.
    assert not any("@" in s["metric"]["request_class"] for s in rows)
    assert {s["metric"]["load_level"] for s in rows if s["metric"]["model"] == AGENT} >= {"1"}
    assert {s["metric"]["load_level"] for s in rows if s["metric"]["model"] != AGENT} == {"any"}
    for sample in rows:
        m = sample["metric"]
        row = (m["model"], m["request_class"], m["load_level"])
        expected = speed[(*row, m["profile"])] / speed[(*row, "off")]
        assert math.isclose(float(sample["value"][1]), expected, rel_tol=0.01), (m, expected)
    # Whether drafting pays, from the first minute: each process's start-up calibration per
    # load, depth 0 and the deepest side by side, the one-slot process's alone.
    off, deep, ratio, _ = panel_exprs("Does drafting pay? Start-up calibration")
    drafting = proxy.get_json("/admin/drafting", admin_key=ADMIN_KEY)[1]["backends"]
    measured = {
        (b["backend"], str(level["measured_load"])): level
        for b in drafting
        for level in b["levels"]
    }
    assert {backend for backend, _ in measured} == {f"{AGENT}/one-process", f"{SOLO}/one-process"}
    assert {load for backend, load in measured if backend == f"{SOLO}/one-process"} == {"1"}
    for expr, key in ((off, "off_tok_s"), (deep, "deep_tok_s"), (ratio, "ratio")):
        rows = prometheus.query(expr)
        shown = {(s["metric"]["backend"], s["metric"]["load"]): float(s["value"][1]) for s in rows}
        assert set(measured) <= set(shown), (expr, shown)
        for row, level in measured.items():
            assert math.isclose(shown[row], level[key], rel_tol=0.01), (expr, row, level)
    # Whether the build honours the depth field.
    (control,) = panel_exprs("Draft control per backend")
    found = {s["metric"]["backend"]: s["metric"]["control"] for s in prometheus.query(control)}
    assert found["mtp-demo/off"] == "none" and found[f"{AGENT}/one-process"] == "per-request"
    # Whether the chat template takes a system message that is not first (the simulator's
    # setup-b refuses it, as Qwen3.5/3.6's template does).
    (template,) = panel_exprs("Chat template: a system message that is not first")
    found = {s["metric"]["backend"]: s["metric"]["late_system"] for s in prometheus.query(template)}
    assert found["mtp-demo/off"] == found[f"{AGENT}/one-process"] == "refused", found
    # Drafted and accepted tokens per second: the drafting profiles only (zeros hidden).
    for expr in panel_exprs("Drafted and accepted tokens/s"):
        assert labels_of(prometheus, expr, "profile") == DRAFTING, expr


def test_zero_series_are_hidden(scraped: tuple[Prometheus, ProxyProcess]) -> None:
    prometheus, _ = scraped
    (mix,) = panel_exprs("Routing mix by reason and profile")
    shown = prometheus.query(mix)
    assert shown and all(float(s["value"][1]) > 0 for s in shown)
    primed = prometheus.query(mix.removesuffix(" > 0"))
    assert len(primed) > len(shown)  # the reasons never chosen are primed at 0, not drawn

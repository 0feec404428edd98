"""deploy/'s files read as data: the alert rules and their test cases, the Grafana dashboard and
the systemd unit, against the metric names the proxy really exports and its settings (the real
tools check them in tests/deploy/test_deploy.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from proxy.config.routing import RoutingSettings
from proxy.config.settings import load_settings
from proxy.observability.collectors import BackendsCollector
from proxy.observability.metrics import ProxyMetrics
from proxy.plans.plan import ONE_PROCESS
from proxy.state import ProxyState
from supervisor.settings import SupervisorSettings
from tests.support.deploy_files import (
    DASHBOARD,
    PROMETHEUS,
    REPO,
    alert_rules,
    unit_value,
    unit_values,
    yaml,
)

# Series that Prometheus itself creates for every target, usable in alerts.
PROMETHEUS_SYNTHETIC = frozenset({"up"})
_PROMQL_WORDS = frozenset(
    {
        "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
        "group_left", "group_right", "inf", "nan", "sum", "min", "max", "avg", "count",
        "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    }
)  # fmt: skip


def exported_metric_names() -> set[str]:
    """Every series name the proxy's /metrics can hold, as Prometheus sees them."""
    registry = CollectorRegistry()
    ProxyMetrics(registry)
    empty = SimpleNamespace(
        backends=SimpleNamespace(all=list),
        models=SimpleNamespace(primary_names=list),
        supervisor=None,
        router=SimpleNamespace(learned_rows=list, stats=SimpleNamespace(busy={})),
        settings=SimpleNamespace(models=[], server=SimpleNamespace(vllm_metrics=True)),
        plans={},
    )
    registry.register(BackendsCollector(cast(ProxyState, empty)))
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords and labels left out)."""
    text = re.sub(r"\$\{?\w+\}?", " ", expr)  # Grafana variables: $model, ${datasource}
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers, strings in them included
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\"[^\"]*\"|'[^']*'", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        followed_by_call = text[match.end() :].lstrip().startswith("(")
        if not followed_by_call and match.group().lower() not in _PROMQL_WORDS:
            names.add(match.group())
    return names


def test_promql_name_extraction_is_not_vacuous() -> None:
    expr = (
        'sum by (model, le) (rate(a_bucket{status=~"5..",x="y z"}[5m])) / on (model) '
        "group_left max(b) > bool 0.95 and c offset 1h or histogram_quantile(0.5, d) unless 1e3"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b", "c", "d"}


def test_exported_names_cover_both_sources() -> None:
    names = exported_metric_names()
    # Counters gain _total, histograms their three series, collector families keep their names.
    assert {"mtp_proxy_requests_total", "mtp_proxy_request_duration_seconds_bucket"} <= names
    assert {"mtp_proxy_backend_ready", "mtp_proxy_backend_crash_loops_total"} <= names
    assert "mtp_proxy_learned_acceptance_ratio" in names
    assert "mtp_proxy_backend_speculation_info" in names  # an info family: its _info series
    assert "mtp_proxy_requests" not in names
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= names


# --- Prometheus ---------------------------------------------------------------------------


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for rule in alert_rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case.get("exp_alerts") for case in mine), f"{rule['alert']}: no firing case"
        assert any(not case.get("exp_alerts") for case in mine), f"{rule['alert']}: none silent"


def test_alerts_are_labelled_and_annotated() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_alerts_cover_the_operational_failures() -> None:
    used = {name for rule in alert_rules() for name in promql_metric_names(rule["expr"])}
    assert {
        "mtp_proxy_backend_ready",
        "mtp_proxy_backend_crash_loops_total",
        "mtp_proxy_backend_state",
        "mtp_proxy_draft_accepted_tokens_total",
        "mtp_proxy_draft_tokens_total",
        "mtp_proxy_requests_total",
        "mtp_proxy_request_duration_seconds_bucket",
    } <= used


def test_alerts_use_only_exported_metrics() -> None:
    exported = exported_metric_names() | PROMETHEUS_SYNTHETIC
    for rule in alert_rules():
        used = promql_metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        assert used <= exported, f"{rule['alert']}: not exported: {sorted(used - exported)}"


# --- Grafana ------------------------------------------------------------------------------

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def test_dashboard_identity_and_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert (dashboard["title"], dashboard["uid"]) == ("mtp-proxy", "mtp-proxy")
    assert dashboard["schemaVersion"] >= 36 and dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_every_panel_and_target_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    queries = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(queries) >= 15
    for panel in queries:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_dashboard_layout(dashboard: dict[str, Any]) -> None:
    all_panels = list(panels(dashboard))
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    rows = [p["title"] for p in all_panels if p["type"] == "row"]
    assert rows == ["Overview", "Speculative decoding", "Backends"]
    cells: set[tuple[int, int]] = set()
    for panel in all_panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}  # fmt: skip
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


def dashboard_metric_names(dashboard: dict[str, Any]) -> dict[str, set[str]]:
    """Metric names per panel title (and per variable), from every query in the dashboard."""
    used = {}
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            key = f"{panel['title']} / {target['refId']}"
            used[key] = promql_metric_names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            match = re.fullmatch(r"label_values\((\w+)(\{[^}]*\})?,\s*\w+\)", query)
            assert match, f"variable {variable['name']}: unexpected query {query!r}"
            used[f"${variable['name']}"] = {match.group(1)}
    return used


def test_dashboard_uses_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    exported = exported_metric_names()
    for where, names in dashboard_metric_names(dashboard).items():
        assert names, f"{where}: no metric found"
        assert names <= exported, f"{where}: not exported: {sorted(names - exported)}"


def test_dashboard_shows_what_operators_need(dashboard: dict[str, Any]) -> None:
    used = set().union(*dashboard_metric_names(dashboard).values())
    assert {
        "mtp_proxy_requests_total",
        "mtp_proxy_request_duration_seconds_bucket",
        "mtp_proxy_output_tokens_total",
        "mtp_proxy_draft_accepted_tokens_total",
        "mtp_proxy_draft_tokens_total",
        "mtp_proxy_decode_tokens_per_second_bucket",
        "mtp_proxy_routing_decisions_total",
        "mtp_proxy_learned_decode_tokens_per_second",
        "mtp_proxy_learned_acceptance_ratio",
        "mtp_proxy_backend_state",
        "mtp_proxy_backend_restarts_total",
        "mtp_proxy_backend_in_flight",
        "mtp_proxy_queued_requests",
        "mtp_proxy_backend_health_check_failures_total",
        "mtp_proxy_backend_busy_depth",
        "mtp_proxy_backend_depth",
        "mtp_proxy_calibration_speed_tokens_per_second",
        "mtp_proxy_backend_draft_control",
        "mtp_proxy_backend_late_system",
    } <= used
    learned = [p for p in panels(dashboard) if p["title"] == "Learned routing table"]
    assert [p["type"] for p in learned] == ["table"]
    by_title = {p["title"]: p for p in panels(dashboard)}
    depth_now = by_title["Depth each process runs now"]
    assert depth_now["type"] == "gauge"
    exprs = [promql_metric_names(t["expr"]) for t in depth_now["targets"]]
    assert exprs == [{"mtp_proxy_backend_depth"}, {"mtp_proxy_backend_busy_depth"}]
    drafted = [t["expr"] for t in by_title["Drafted and accepted tokens/s"]["targets"]]
    assert [promql_metric_names(e) for e in drafted] == [
        {"mtp_proxy_draft_tokens_total"},
        {"mtp_proxy_draft_accepted_tokens_total"},
    ]
    (speedup,) = by_title["Speedup against off (learned)"]["targets"][:1]
    assert 'profile="$off"' in speedup["expr"] and "group_left" in speedup["expr"]


def test_dashboard_variables_come_from_the_request_metrics(dashboard: dict[str, Any]) -> None:
    """Not from mtp_proxy_backend_ready: in the one-process shape its profile is the process's
    ("one-process"), and picking it would empty every request and MTP panel."""
    queries = {
        v["name"]: v["query"]["query"]
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    }
    assert set(queries) == {"model", "profile", "box"}  # box: one proxy per box, its instance
    for query in queries.values():
        match = re.fullmatch(r"label_values\((\w+)\{[^}]*\}, *\w+\)", query)
        assert match and match.group(1) == "mtp_proxy_requests_total", query
        assert '!="none"' in query  # requests refused before routing have no model or profile
    (off,) = [v for v in dashboard["templating"]["list"] if v["name"] == "off"]
    assert off["type"] == "textbox" and off["query"] == RoutingSettings().profile_off


def test_backend_panels_keep_one_process_backends_at_every_profile(
    dashboard: dict[str, Any],
) -> None:
    """A one-process backend carries profile="one-process" and serves every profile: a backend
    panel filtering on $profile alone went empty once a profile was chosen."""
    filtered = 0
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            for selector in re.findall(r"(mtp_proxy_backend_\w+)\{([^}]*)\}", target["expr"]):
                if "$profile" in selector[1]:
                    filtered += 1
                    wanted = 'profile=~"$profile|one-process"'
                    assert wanted in selector[1], (panel["title"], selector)
    assert filtered >= 3  # in flight, restarts, crash loops, health checks
    assert ONE_PROCESS == "one-process"


def test_draft_panels_filter_by_model(dashboard: dict[str, Any]) -> None:
    """The draft metrics carry `model` (tests/proxy/test_metrics.py reads it from /metrics)."""
    mtp = [p for p in panels(dashboard) if "acceptance" in p["title"].lower()]
    for panel in mtp:
        for target in panel["targets"]:
            if "mtp_proxy_draft" in target["expr"]:
                assert 'model=~"$model"' in target["expr"], panel["title"]


ZERO_HIDDEN = (
    "Routing mix by reason and profile",
    "Output tokens/s",
    "Upstream retries and stream failures",
    "Restarts and crash loops",
    "Health-check failures",
    "Drafted and accepted tokens/s",
)


def test_series_that_stay_zero_are_hidden(dashboard: dict[str, Any]) -> None:
    by_title = {p["title"]: p for p in panels(dashboard)}
    for title in ZERO_HIDDEN:
        for target in by_title[title]["targets"]:
            assert target["expr"].rstrip().endswith("> 0"), (title, target["expr"])


def test_dashboard_asks_for_its_data_source_on_import(dashboard: dict[str, Any]) -> None:
    (source,) = dashboard["__inputs"]
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    placeholder = "${" + source["name"] + "}"
    # The import replaces the placeholder with the data source picked: the variable's default.
    assert variables["datasource"]["current"]["value"] == placeholder
    assert DASHBOARD.read_text().count("${DS_") == DASHBOARD.read_text().count(placeholder)


def test_provisioning_files_fit_the_dashboard_and_the_docs() -> None:
    grafana = DASHBOARD.parent / "provisioning"
    (source,) = yaml.safe_load((grafana / "datasources" / "mtp-proxy.yml").read_text())[
        "datasources"
    ]
    (provider,) = yaml.safe_load((grafana / "dashboards" / "mtp-proxy.yml").read_text())[
        "providers"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://127.0.0.1:9090"
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["global"]
    assert source["jsonData"]["timeInterval"] == scrape["scrape_interval"]
    steps = (REPO / "docs" / "operations.md").read_text()
    # The steps put the dashboard where the provider reads, bound to the provisioned source.
    assert f"DS_PROMETHEUS}}/{source['uid']}/g" in steps
    assert f"{provider['options']['path']}/mtp-proxy.json" in steps
    for kind in ("datasources", "dashboards"):
        assert f"deploy/grafana/provisioning/{kind}/mtp-proxy.yml" in steps


def test_dashboard_variables_are_defined(dashboard: dict[str, Any]) -> None:
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    text = DASHBOARD.read_text()
    # $__rate_interval, $__all, ...: Grafana's built-ins.
    referenced = {name for name in re.findall(r"\$\{?(\w+)", text) if not name.startswith("__")}
    inputs = {source["name"] for source in dashboard["__inputs"]}  # filled in at import
    assert referenced <= defined | inputs, sorted(referenced - defined - inputs)


# --- systemd ------------------------------------------------------------------------------


def test_unit_lifecycle_settings_fit_the_proxy() -> None:
    assert unit_value("Type") == "notify" and unit_value("NotifyAccess") == "main"
    assert unit_value("KillMode") == "mixed" and unit_value("Restart") == "on-failure"
    defaults = SupervisorSettings()
    assert int(unit_value("TimeoutStopSec")) > defaults.drain_timeout_s + defaults.stop_timeout_s
    assert int(unit_value("TimeoutStartSec")) > defaults.ready_timeout_s
    assert int(unit_value("LimitNOFILE")) >= 65536
    assert unit_value("User") == unit_value("Group") == "mtp-proxy"
    assert not unit_values("DynamicUser") and not unit_values("MemoryDenyWriteExecute")
    command = unit_value("ExecStart").split()
    assert command[1:] == ["serve", "--config", "/etc/mtp-proxy/config.toml"]


def test_unit_environment_configures_the_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The unit's MTP_PROXY_* variables must name real settings: load the example config (the one
    # install.sh copies) under them and see them take effect.
    environment = dict(v.split("=", 1) for v in unit_values("Environment"))
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(REPO / "config.toml")
    assert settings.log.format == "json"
    state_file = Path(environment["MTP_PROXY_ROUTING__LEARNED_FILE"])
    assert settings.routing.learned_file == state_file
    assert state_file.parent == Path("/var/lib") / unit_value("StateDirectory")
    assert environment["PYTHONUNBUFFERED"] == "1"


def test_the_alert_list_in_the_docs_is_the_rules_file() -> None:
    """docs/operations.md lists every alert of deploy/prometheus/alerts.yml, in its order, with
    its severity and its `for:`; it listed 7 of 8 once."""
    rules = alert_rules()
    text = (REPO / "docs" / "operations.md").read_text()
    start = "<!-- alerts: the rules of deploy/prometheus/alerts.yml, in its order -->"
    end = "<!-- /alerts -->"
    assert text.count(start) == text.count(end) == 1
    listed = re.findall(
        r"^- `(MtpProxy\w+)` \((\w+)(?:, (\w+))?\): ", text.split(start)[1].split(end)[0], re.M
    )
    assert listed == [
        (rule["alert"], rule["labels"]["severity"], rule.get("for", "")) for rule in rules
    ]

"""/metrics after real traffic through a real proxy process: every family the operator needs,
with the right labels, values that match what the clients were told, bounded label values, and
an exposition that `promtool check metrics` accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.routing.choice import Reason
from proxy.routing.plausibility import IMPLAUSIBLE
from proxy.serving.connections import CLOSE_CAUSES
from supervisor.draft_probe import DraftControl
from supervisor.states import BackendState
from supervisor.template_check import LateSystem
from tests.support.harness import ADMIN_KEY, ProxyProcess, proxy_config, running_proxy
from tests.support.traffic import (
    MODEL,
    UNROUTED,
    Sent,
    body_for,
    send,
    standard_mix,
    wait_all_ready,
)

PROFILES = ("off", "min", "max")
CLASS = "<4k/prose"  # every request of the mix is a short prose prompt
SESSION = f"sess-{uuid.uuid4().hex}"

LEARNED_LABELS = {"model", "request_class", "load_level", "profile"}
# family -> (type, label names without "le")
FAMILIES = {
    "mtp_proxy_requests": ("counter", {"model", "api", "profile", "request_class", "status"}),
    "mtp_proxy_request_duration_seconds": ("histogram", {"model", "api", "profile"}),
    "mtp_proxy_time_to_first_token_seconds": ("histogram", {"model", "api", "profile"}),
    "mtp_proxy_proxy_overhead_seconds": ("histogram", {"api"}),
    "mtp_proxy_output_tokens": ("counter", {"model", "profile"}),
    "mtp_proxy_decode_tokens_per_second": (
        "histogram",
        {"model", "profile", "request_class", "load_level"},
    ),
    "mtp_proxy_draft_acceptance_ratio": ("histogram", {"model", "profile", "request_class"}),
    "mtp_proxy_draft_tokens": ("counter", {"model", "profile", "request_class"}),
    "mtp_proxy_draft_accepted_tokens": ("counter", {"model", "profile", "request_class"}),
    "mtp_proxy_context_tokens": ("histogram", {"model", "profile"}),
    "mtp_proxy_cached_prompt_ratio": ("histogram", {"model", "profile"}),
    "mtp_proxy_routing_decisions": ("counter", {"model", "reason", "profile"}),
    "mtp_proxy_upstream_retries": ("counter", {"model"}),
    "mtp_proxy_upstream_failures": ("counter", {"model", "profile"}),
    "mtp_proxy_state_save_failures": ("counter", set()),
    "mtp_proxy_observations_dropped": ("counter", {"model", "reason"}),
    "mtp_proxy_queued_requests": ("gauge", {"model"}),
    "mtp_proxy_backend_in_flight": ("gauge", {"backend", "model", "profile"}),
    "mtp_proxy_backend_slots": ("gauge", {"backend", "model", "profile"}),
    "mtp_proxy_backend_ready": ("gauge", {"backend", "model", "profile"}),
    "mtp_proxy_backend_state": ("gauge", {"backend", "model", "profile", "state"}),
    "mtp_proxy_backend_restarts": ("counter", {"backend", "model", "profile"}),
    "mtp_proxy_backend_crash_loops": ("counter", {"backend", "model", "profile"}),
    "mtp_proxy_backend_health_check_failures": ("counter", {"backend", "model", "profile"}),
    # An info family: Prometheus' text format shows it as a gauge of 1 named *_info.
    "mtp_proxy_backend_speculation_info": (
        "gauge",
        {"backend", "model", "profile", "spec_type", "draft_model"},
    ),
    "mtp_proxy_learned_decode_tokens_per_second": ("gauge", LEARNED_LABELS),
    "mtp_proxy_learned_acceptance_ratio": ("gauge", LEARNED_LABELS),
    "mtp_proxy_learned_samples": ("gauge", LEARNED_LABELS),
}

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    text: str
    types: dict[str, str]
    helps: dict[str, str]
    samples: dict[str, dict[Labels, float]]  # sample name -> labels -> value

    def series(self, name: str, **match: str) -> dict[Labels, float]:
        return {
            labels: value
            for labels, value in self.samples.get(name, {}).items()
            if set(match.items()) <= labels
        }

    def total(self, name: str, **match: str) -> float:
        return sum(self.series(name, **match).values())

    def by(self, name: str, *keys: str, **match: str) -> dict[tuple[str, ...], float]:
        """Values of `name` summed over every label but `keys` (like PromQL `sum by`), without
        zeros: a series created at 0 is no traffic."""
        summed: dict[tuple[str, ...], float] = {}
        for labels, value in self.series(name, **match).items():
            found = dict(labels)
            key = tuple(found[k] for k in keys)
            summed[key] = summed.get(key, 0.0) + value
        return {key: value for key, value in summed.items() if value}


def parse(text: str) -> Scrape:
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        types[family.name], helps[family.name] = family.type, family.documentation
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return Scrape(text, types, helps, samples)


def scrape(proxy: ProxyProcess) -> Scrape:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return parse(response.read().decode())


@dataclass(frozen=True)
class Run:
    proxy: ProxyProcess
    sent: list[Sent]
    scrape: Scrape


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir: Path = tmp_path_factory.mktemp("metrics-proxy")
    with running_proxy(proxy_config(), workdir) as proxy:
        wait_all_ready(proxy)
        sent = standard_mix(proxy.url, headers={"X-MTP-Session": SESSION})
        yield Run(proxy, sent, settled_scrape(proxy, sent))


def settled_scrape(proxy: ProxyProcess, sent: list[Sent], timeout: float = 15.0) -> Scrape:
    """The /messages answer carries no timings: its observation is recorded after it went out
    (from the backend's counters). Scrape once every answered request has been observed."""
    expected = sum(s.output_tokens for s in sent)
    deadline = time.monotonic() + timeout
    while True:
        result = scrape(proxy)
        if result.total("mtp_proxy_output_tokens_total") == expected:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"output tokens never reached {expected}:\n{result.text}")
        time.sleep(0.05)


def count(sent: list[Sent], *keys: str) -> Counter[tuple[str, ...]]:
    return Counter(tuple(str(getattr(s, k)) for k in keys) for s in sent)


def test_the_traffic_went_where_it_was_sent(run: Run) -> None:
    # The rest of this file compares /metrics with these answers: make sure they are the mix.
    pinned = [s for s in run.sent if s.api == "chat" and s.status == 200]
    assert count(pinned, "profile") == {(p,): 5 for p in PROFILES}
    assert {s.reason for s in pinned} == {"pinned"}
    assert count(run.sent, "api", "status") == {
        ("chat", "200"): 15,
        ("chat", "404"): 1,
        ("chat", "400"): 1,
        ("messages", "200"): 1,
        ("responses", "200"): 1,
        ("completions", "200"): 1,
    }
    assert all(s.output_tokens > 0 for s in run.sent if s.status == 200)


def test_every_family_is_exported_with_its_labels(run: Run) -> None:
    for name, (kind, labels) in FAMILIES.items():
        assert run.scrape.types.get(name) == kind, name
        assert run.scrape.helps[name].strip(), name
        suffixes = ("_bucket", "_count", "_sum") if kind == "histogram" else ("_total",)
        suffix = suffixes[0] if kind != "gauge" else ""
        series = run.scrape.samples.get(name + suffix)
        assert series, f"{name}{suffix}: no series after traffic"
        for sample_labels in series:
            assert {k for k, _ in sample_labels} - {"le"} == labels, name


def test_requests_are_counted_by_model_api_profile_class_and_status(run: Run) -> None:
    expected = Counter(
        (MODEL if s.routed else UNROUTED, s.api, s.profile, str(s.status)) for s in run.sent
    )
    got = run.scrape.by("mtp_proxy_requests_total", "model", "api", "profile", "status")
    assert got == expected
    classes = run.scrape.by("mtp_proxy_requests_total", "profile", "request_class")
    assert {c for (p, c) in classes if p != UNROUTED} == {CLASS}
    assert {c for (p, c) in classes if p == UNROUTED} == {UNROUTED}


def test_latency_histograms_count_every_request(run: Run) -> None:
    s = run.scrape
    everything = Counter((MODEL if x.routed else UNROUTED, x.api, x.profile) for x in run.sent)
    assert s.by("mtp_proxy_request_duration_seconds_count", "model", "api", "profile") == (
        everything
    )
    streams = Counter((MODEL, x.api, x.profile) for x in run.sent if x.stream)
    ttft = s.by("mtp_proxy_time_to_first_token_seconds_count", "model", "api", "profile")
    assert ttft == streams
    routed = Counter((x.api,) for x in run.sent if x.routed)
    assert s.by("mtp_proxy_proxy_overhead_seconds_count", "api") == routed
    for name in ("request_duration_seconds", "time_to_first_token_seconds"):
        assert 0 < s.total(f"mtp_proxy_{name}_sum") < 60, name  # seconds, not milliseconds
        # Cumulative buckets: +Inf holds every observation.
        assert s.total(f"mtp_proxy_{name}_bucket", le="+Inf") == s.total(f"mtp_proxy_{name}_count")
    overhead = s.total("mtp_proxy_proxy_overhead_seconds_sum") / sum(routed.values())
    assert overhead > 0
    # The docs' figure is ~1 ms (bench.overhead: 1.03-1.14 ms p50 on a quiet machine). As a
    # share, not one sample: three quarters of the requests within 10 ms of their arrival,
    # which a loaded machine keeps and a proxy ten times slower does not.
    within = s.total("mtp_proxy_proxy_overhead_seconds_bucket", le="0.01")
    assert within >= 0.75 * sum(routed.values()), (within, routed)


def test_output_tokens_match_the_answers(run: Run) -> None:
    expected: Counter[tuple[str, ...]] = Counter()
    for x in run.sent:
        expected[(MODEL, x.profile)] += x.output_tokens
    assert run.scrape.by("mtp_proxy_output_tokens_total", "model", "profile") == +expected


def test_draft_counters_match_the_answers_timings(run: Run) -> None:
    s = run.scrape
    drafted, accepted = Counter[tuple[str, ...]](), Counter[tuple[str, ...]]()
    for x in run.sent:
        drafted[(MODEL, x.profile, CLASS)] += x.draft_n
        accepted[(MODEL, x.profile, CLASS)] += x.draft_accepted
    assert drafted[(MODEL, "min", CLASS)] > 0 and drafted[(MODEL, "max", CLASS)] > 0
    assert drafted[(MODEL, "off", CLASS)] == 0
    keys = ("model", "profile", "request_class")
    assert s.by("mtp_proxy_draft_tokens_total", *keys) == +drafted
    assert s.by("mtp_proxy_draft_accepted_tokens_total", *keys) == +accepted
    assert not s.series("mtp_proxy_draft_tokens_total", profile="off")


def test_decode_speed_and_acceptance_histograms(run: Run) -> None:
    s = run.scrape
    # Every answer with timings has a decode speed (the /messages one has none).
    timed = Counter((MODEL, x.profile, CLASS) for x in run.sent if x.routed and x.api != "messages")
    keys = ("model", "profile", "request_class")
    assert s.by("mtp_proxy_decode_tokens_per_second_count", *keys) == timed
    # A pool learns across loads: its speeds are labelled so, never with a level of their own.
    assert set(s.by("mtp_proxy_decode_tokens_per_second_count", "load_level")) == {("any",)}
    speed = s.total("mtp_proxy_decode_tokens_per_second_sum") / sum(timed.values())
    assert 1 < speed < 100_000
    speculative = [x for x in run.sent if x.draft_n]
    assert s.by("mtp_proxy_draft_acceptance_ratio_count", *keys) == Counter(
        (MODEL, x.profile, CLASS) for x in speculative
    )
    for profile in ("min", "max"):
        ratios = [x.draft_accepted / x.draft_n for x in speculative if x.profile == profile]
        got = s.total("mtp_proxy_draft_acceptance_ratio_sum", profile=profile)
        assert got == pytest.approx(sum(ratios))


def test_context_and_cached_prompt_histograms(run: Run) -> None:
    s = run.scrape
    answered = [x for x in run.sent if x.routed]
    by_profile = Counter((MODEL, x.profile) for x in answered)
    assert s.by("mtp_proxy_context_tokens_count", "model", "profile") == by_profile
    assert s.by("mtp_proxy_cached_prompt_ratio_count", "model", "profile") == by_profile
    assert s.total("mtp_proxy_context_tokens_sum") == sum(x.context_tokens for x in answered)
    # The same short prompt over and over: the backends' prefix caches serve most of it.
    assert 0 < s.total("mtp_proxy_cached_prompt_ratio_sum") <= len(answered)


def test_routing_decisions_by_reason(run: Run) -> None:
    s = run.scrape
    pinned = s.by("mtp_proxy_routing_decisions_total", "profile", reason="pinned")
    # Pinned: the 5 chats of each profile, plus the /messages request pinned to off.
    assert pinned == {("off",): 6, ("min",): 5, ("max",): 5}
    routed = sum(1 for x in run.sent if x.routed)
    assert s.total("mtp_proxy_routing_decisions_total") == routed
    # Every reason of the policy has a series per model and profile from the start (at 0), so
    # rate() sees its first decision and the dashboard lists them all.
    for profile in PROFILES:
        series = s.series("mtp_proxy_routing_decisions_total", model=MODEL, profile=profile)
        assert {dict(k)["reason"] for k in series} == set(get_args(Reason)), profile
    assert s.total("mtp_proxy_upstream_retries_total") == 0
    assert s.total("mtp_proxy_upstream_failures_total") == 0


def test_backend_series(run: Run) -> None:
    s = run.scrape
    backends = {f"{MODEL}/{p}": p for p in PROFILES}
    for backend, profile in backends.items():
        where = {"backend": backend, "model": MODEL, "profile": profile}
        states = {
            dict(k)["state"]: v for k, v in s.series("mtp_proxy_backend_state", **where).items()
        }
        assert states == {state.value: float(state == BackendState.READY) for state in BackendState}
        assert s.total("mtp_proxy_backend_ready", **where) == 1
        assert s.total("mtp_proxy_backend_slots", **where) == 4  # -np 4 in the simulator args
        assert s.series("mtp_proxy_backend_in_flight", **where) == {frozenset(where.items()): 0}
        for counter in ("restarts", "crash_loops", "health_check_failures"):
            assert s.series(f"mtp_proxy_backend_{counter}_total", **where), counter
            assert s.total(f"mtp_proxy_backend_{counter}_total", **where) == 0, counter
    assert s.series("mtp_proxy_queued_requests") == {frozenset({("model", MODEL)}): 0}


def test_each_backend_says_what_it_drafts_with(run: Run) -> None:
    # The speculative type of each process, as the profiles configure it (the simulator's pool:
    # off does not draft, min and max draft with draft-mtp); no draft model.
    found = {
        dict(labels)["backend"]: (dict(labels)["spec_type"], dict(labels)["draft_model"], value)
        for labels, value in run.scrape.series("mtp_proxy_backend_speculation_info").items()
    }
    assert found == {
        f"{MODEL}/off": ("none", "", 1.0),
        f"{MODEL}/min": ("draft-mtp", "", 1.0),
        f"{MODEL}/max": ("draft-mtp", "", 1.0),
    }
    # Drafted tokens are the backends' speculative type's, whichever it is.
    assert "speculative type" in run.scrape.helps["mtp_proxy_draft_tokens"]
    assert "MTP heads." not in run.scrape.helps["mtp_proxy_draft_tokens"]
    assert "speculative type" in run.scrape.helps["mtp_proxy_backend_speculation_info"]


def test_learned_table_gauges_match_the_admin_view(run: Run) -> None:
    status, routing = run.proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)
    assert status == 200
    rows = {
        (r["model"], r["request_class"], r["load_level"], r["profile"]): r
        for r in routing["learned"]
    }
    assert {p for (_, c, _, p) in rows if c == CLASS} == set(PROFILES)
    # One class format everywhere: the class alone, its load level in a label of its own.
    assert all("@" not in c and level == "any" for (_, c, level, _) in rows)  # a pool's
    s = scrape(run.proxy)  # now, as /admin/routing was read (no request is running)
    for (model, cls, level, profile), row in rows.items():
        where = {"model": model, "request_class": cls, "load_level": level, "profile": profile}
        speed = s.series("mtp_proxy_learned_decode_tokens_per_second", **where)
        assert list(speed.values()) == [pytest.approx(row["decode_tok_s"])]
        assert s.total("mtp_proxy_learned_samples", **where) == pytest.approx(row["weight"])
        acceptance = s.series("mtp_proxy_learned_acceptance_ratio", **where)
        if row["acceptance"] is None:  # off never drafts: no series rather than NaN
            assert not acceptance
        else:
            assert list(acceptance.values()) == [pytest.approx(row["acceptance"])]
    for profile in ("min", "max"):
        learned = s.total("mtp_proxy_learned_acceptance_ratio", profile=profile)
        assert 0 < learned <= 1


def test_label_values_are_bounded(run: Run) -> None:
    allowed = {
        "model": {MODEL, UNROUTED},
        "api": {"chat", "completions", "responses", "messages"},
        "profile": {*PROFILES, UNROUTED},
        "reason": {*get_args(Reason), *IMPLAUSIBLE},  # routing decisions, dropped answers
        "state": {state.value for state in BackendState},
        "control": set(get_args(DraftControl)),
        "late_system": set(get_args(LateSystem)),
        "backend": {f"{MODEL}/{p}" for p in PROFILES},
        "request_class": {CLASS, UNROUTED},
        "load_level": {"any"},  # a pool's: measured across loads
        "source": {"pool"},  # the depth now of a pool process: its profile's
        "cause": set(CLOSE_CAUSES),
        "spec_type": {"none", "draft-mtp"},
        "draft_model": {""},
    }
    secrets = {SESSION, "no-such-model", *(x.request_id for x in run.sent)}
    for name, series in run.scrape.samples.items():
        if not name.startswith("mtp_proxy_"):
            continue
        for labels in series:
            for key, value in labels:
                assert not any(secret in value for secret in secrets), (name, key, value)
                if key == "status":
                    assert re.fullmatch(r"[1-5]\d\d", value), (name, value)
                elif key == "le":
                    assert value == "+Inf" or float(value) >= 0
                else:
                    assert value in allowed[key], (name, key, value)


def test_promtool_accepts_the_exposition(run: Run) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run scripts/install-tools.sh (as root) first")

    def check(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [promtool, "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    # The vLLM-named gauges keep vLLM's colons on purpose (balancers read them by that name),
    # which promtool's lint flags; those two findings and nothing else.
    vllm = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    findings = check(run.scrape.text)
    said = sorted(line for line in (findings.stdout + findings.stderr).splitlines() if line)
    assert said == [f"{name} metric names should not contain ':'" for name in vllm]
    ours = "\n".join(line for line in run.scrape.text.splitlines() if "vllm:" not in line)
    result = check(ours + "\n")
    print(result.stdout, result.stderr)
    # Lint findings (names, units, _total suffixes, HELP) make it exit non-zero with a message.
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (result.stdout + result.stderr).strip()


def test_a_later_request_moves_only_its_own_series(run: Run) -> None:
    before = run.scrape
    answer = send(
        run.proxy.url, "completions", body_for("completions", stream=False),
        headers={"X-MTP-Profile": "max"},
    )  # fmt: skip
    assert answer.status == 200
    after = settled_scrape(run.proxy, [*run.sent, answer])
    where = {"api": "completions", "profile": "max", "status": "200"}
    assert after.total("mtp_proxy_requests_total", **where) == (
        before.total("mtp_proxy_requests_total", **where) + 1
    )
    assert after.total("mtp_proxy_requests_total") == before.total("mtp_proxy_requests_total") + 1
    assert after.total("mtp_proxy_draft_tokens_total", profile="max") == (
        before.total("mtp_proxy_draft_tokens_total", profile="max") + answer.draft_n
    )

"""Acceptance on Claude Code's path: answers without timings, drafts from the backend's counters.

`/v1/messages` and non-stream `/v1/responses` carry no `draft_n`; the proxy takes the request's
drafts from the movement of the backend's `llamacpp:spec_decode_num_*` counters when the request
ran alone there. Here requests go one at a time to drafting profiles of simulated backends, and
the test reads the same counters itself, before and after each request: the proxy's log line
and its learned table must say what the counters moved by.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
    wait_all_ready,
)
from tests.support.traffic import body_for, send

DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
REQUESTS = 5


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    model = simulator_model(time_scale=50.0, extra_args=["--seed", "7"])
    config = proxy_config([model], routing={"clock_scale": 50.0})
    with running_proxy(config, tmp_path_factory.mktemp("counters")) as running:
        wait_all_ready(running, {"mtp-demo": 3})
        yield running


def backend_counters(proxy: ProxyProcess, profile: str) -> tuple[float, float]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    url = next(row["url"] for row in rows if row["profile"] == profile)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return values[DRAFTED], values[ACCEPTED]


def request_line(proxy: ProxyProcess, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proxy.log_lines():
            if line.get("event") == "request" and line.get("request_id") == request_id:
                return line
        time.sleep(0.02)
    raise AssertionError(f"no log line for request {request_id} within {timeout}s")


def learned_acceptance(proxy: ProxyProcess, profile: str, request_class: str) -> float:
    rows = proxy.get_json("/admin/routing", admin_key=ADMIN_KEY)[1]["learned"]
    row = next(r for r in rows if r["profile"] == profile and r["class"] == request_class)
    return float(row["acceptance"])


@pytest.mark.parametrize(("api", "profile"), [("messages", "max"), ("responses", "min")])
def test_acceptance_without_timings_is_the_backend_counters_movement(
    proxy: ProxyProcess, api: str, profile: str
) -> None:
    pin = {"X-MTP-Profile": profile}
    moved: list[tuple[float, float]] = []
    for i in range(REQUESTS + 1):
        before = backend_counters(proxy, profile)
        body = body_for(api, stream=False, text=f"hello there, number {i}", max_tokens=48)
        sent = send(proxy.url, api, body, headers=pin)
        assert (sent.status, sent.profile) == (200, profile)
        assert sent.draft_n == 0  # nothing in the answer: the counters are the only source
        line = request_line(proxy, sent.request_id)
        after = backend_counters(proxy, profile)
        drafted, accepted = after[0] - before[0], after[1] - before[1]
        assert drafted > 0 and 0 < accepted <= drafted  # the backend did draft
        if i == 0:
            continue  # the backend's first reading: no baseline before it
        assert (line["draft_n"], line["draft_accepted"]) == (drafted, accepted), line
        assert line["acceptance"] == pytest.approx(accepted / drafted)
        moved.append((drafted, accepted))
    # The learned table took those acceptances (decayed: within a few percent of the ratio).
    total = sum(a for _, a in moved) / sum(d for d, _ in moved)
    assert learned_acceptance(proxy, profile, "<4k/prose") == pytest.approx(total, rel=0.05)


def test_overlapping_requests_get_no_acceptance_rather_than_a_wrong_one(
    proxy: ProxyProcess,
) -> None:
    """Three messages at once on one backend: the counters move by their sum, which is no
    single request's, so none of them is given an acceptance (nor drafts)."""
    pin = {"X-MTP-Profile": "max"}
    start = threading.Barrier(3)

    def one(i: int) -> str:
        body = {**body_for("messages", stream=False, text=f"story {i}", max_tokens=800)}
        body["ignore_eos"] = True  # the simulator decodes all 800: the three overlap
        start.wait()
        sent = send(proxy.url, "messages", body, headers=pin)
        assert (sent.status, sent.profile) == (200, "max")
        return sent.request_id

    with ThreadPoolExecutor(3) as pool:
        request_ids = list(pool.map(one, range(3)))
    for request_id in request_ids:
        line = request_line(proxy, request_id)
        assert (line["draft_n"], line["acceptance"]) == (None, None), line


def test_every_request_that_ran_alone_teaches_however_soon_the_next_is_sent(
    tmp_path: Path,
) -> None:
    """Twelve requests one at a time, each sent the moment the last answered (an agent's loop),
    the first right after start-up: each has its drafts and its decode speed from the counters.
    The counters used to be read only after the next request was on the backend: 7 of 12 such
    requests on a real llama-server taught nothing."""
    model = simulator_model(time_scale=50.0, extra_args=["--seed", "7"])
    config = proxy_config([model], routing={"clock_scale": 50.0})
    pin = {"X-MTP-Profile": "max"}
    with running_proxy(config, tmp_path) as fresh:
        wait_all_ready(fresh, {"mtp-demo": 3})
        request_ids = []
        for i in range(12):
            api = ("messages", "responses")[i % 2]
            body = body_for(api, stream=False, text=f"hello there, number {i}", max_tokens=48)
            sent = send(fresh.url, api, body, headers=pin)
            assert (sent.status, sent.profile) == (200, "max")
            request_ids.append(sent.request_id)
        lines = [request_line(fresh, request_id) for request_id in request_ids]
    taught = [(line["api"], line["draft_n"], line["decode_tok_s"]) for line in lines]
    assert all(drafts and speed for _, drafts, speed in taught), taught

"""A backend's impossible numbers are not learned: a real proxy process in front of a real
backend process that answers the `timings` each request names (tests.support.misbehaving_backend,
mode timings). Each impossible answer is dropped and counted under its reason, one warning a
minute says so, and the learned table, the live page's reads and the learned file stay finite:
the next start loads every cell (one such answer used to make the file unreadable whole).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config.routing import RoutingSettings
from proxy.routing.stats import LearnedStats
from tests.support.harness import ADMIN_KEY, ProxyProcess, proxy_config, running_proxy
from tests.support.misbehaving_backend import running_backend
from tests.support.traffic import body_for, send

MODEL = "echo"
GOOD = {"prompt_n": 40, "cache_n": 0, "prompt_ms": 20.0, "predicted_n": 50, "predicted_ms": 1000.0}
# Each answer as an outside test found them, and the reason it is dropped for.
POISONED = [
    ({**GOOD, "predicted_ms": 1e-200}, "too_fast"),  # ~5e201 tok/s
    ({**GOOD, "prompt_n": -5}, "negative"),
    ({**GOOD, "predicted_n": 1e200, "predicted_ms": 1e-200}, "non_finite"),  # the speed: inf
    ({**GOOD, "predicted_n": 1e200}, "too_large"),
    ({**GOOD, "draft_n": 10, "draft_n_accepted": 11}, "drafts"),
]


def refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


@pytest.fixture(scope="module")
def backend_url() -> Iterator[str]:
    with running_backend("timings") as url:
        yield url


def config(backend_url: str, state_file: Path) -> dict[str, Any]:
    model = {
        "name": MODEL,
        "backend": "simulator",
        "profiles": [{"name": "off", "url": backend_url}],
    }
    routing = {"learned_file": str(state_file), "state_save_interval_s": 0.2}
    return proxy_config([model], routing=routing)


def answer(proxy: ProxyProcess, timings: dict[str, float]) -> None:
    body = {**body_for("chat", stream=False), "model": MODEL}
    sent = send(proxy.url, "chat", body, headers={"X-Timings": json.dumps(timings)})
    assert sent.status == 200, sent.body


def dropped_counts(proxy: ProxyProcess) -> dict[str, float]:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "mtp_proxy_observations_dropped_total" and sample.value
    }


def test_impossible_numbers_are_dropped_counted_and_never_reach_the_learned_file(
    backend_url: str, tmp_path: Path
) -> None:
    state_file = tmp_path / "learned.json"
    with running_proxy(config(backend_url, state_file), tmp_path / "run") as proxy:
        for _ in range(3):
            answer(proxy, GOOD)
        for timings, _reason in POISONED:
            answer(proxy, timings)
        answer(proxy, GOOD)
        counts = dropped_counts(proxy)
        assert counts == {reason: 1.0 for _, reason in POISONED}, counts
        request = urllib.request.Request(
            proxy.url + "/admin/routing", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            routing = json.loads(response.read(), parse_constant=refuse)
        (cell,) = [row for row in routing["learned"] if row["model"] == MODEL]
        assert cell["decode_tok_s"] == pytest.approx(50.0) and cell["samples"] == pytest.approx(4)
        warnings = [
            line for line in proxy.log_lines() if line.get("event") == "backend_numbers_dropped"
        ]
        lines = [line for line in proxy.log_lines() if line.get("event") == "request"]
    # One warning a minute per backend, however many answers were dropped.
    assert len(warnings) == 1 and warnings[0]["reason"] == "too_fast", warnings
    assert [line.get("dropped") for line in lines[3:8]] == [r for _, r in POISONED]
    assert all(line["decode_tok_s"] is None for line in lines[3:8])
    saved = json.loads(state_file.read_bytes(), parse_constant=refuse)
    assert saved["cells"], saved
    again = LearnedStats.load(state_file, RoutingSettings(learned_file=state_file))
    assert again.load_report == "loaded 1 cells", again.load_report
    assert not state_file.with_name("learned.json.rejected").exists()

"""One Prometheus scrapes two boxes (the shipped deploy/prometheus/prometheus.yml, both targets in
its job): each box's series under its own instance, the vLLM-named gauges of both, and the
dashboard's box variable lists both, its panels filtered to one box show that box's requests
only."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.deploy import test_prometheus_live as live
from tests.support.boxes import MODEL, two_boxes
from tests.support.harness import ProxyProcess

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "mtp-proxy.json"


@pytest.fixture(scope="module")
def scraped(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[live.Prometheus, list[ProxyProcess]]]:
    workdir = tmp_path_factory.mktemp("prometheus-boxes")
    with two_boxes(workdir) as boxes:
        prometheus = live.start_prometheus(workdir, boxes[0].port, boxes[1].port)
        try:
            asyncio.run(traffic(boxes))
            live.wait_until(
                "both boxes' requests scraped",
                lambda: len(prometheus.query("sum by (instance) (mtp_proxy_requests_total)")) == 2,
            )
            yield prometheus, boxes
        finally:
            live.stop_prometheus(prometheus)


async def traffic(boxes: list[ProxyProcess]) -> None:
    """Box 1 serves 3 requests, box 2 one."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        for box, count in zip(boxes, (3, 1), strict=True):
            for _ in range(count):
                async with session.post(box.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()


def variable_query(name: str) -> tuple[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    match = re.fullmatch(r"label_values\((\w+\{[^}]*\}), *(\w+)\)", variable["query"]["query"])
    assert match, variable["query"]["query"]
    return match.group(1).replace("$model", ".*"), match.group(2)


def test_one_prometheus_scrapes_both_boxes(
    scraped: tuple[live.Prometheus, list[ProxyProcess]],
) -> None:
    prometheus, boxes = scraped
    instances = {f"127.0.0.1:{box.port}" for box in boxes}
    up = {s["metric"]["instance"]: s["value"][1] for s in prometheus.query('up{job="mtp-proxy"}')}
    assert up == dict.fromkeys(instances, "1")
    running = prometheus.query(f'vllm:num_requests_running{{model_name="{MODEL}"}}')
    assert {s["metric"]["instance"] for s in running} == instances
    selector, label = variable_query("box")
    listed = live.labels_of(prometheus, f"group by ({label}) ({selector})", label)
    assert listed == instances  # the dashboard's box variable offers both


def test_a_panel_filtered_to_one_box_shows_that_box(
    scraped: tuple[live.Prometheus, list[ProxyProcess]],
) -> None:
    prometheus, boxes = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    (expr,) = [
        t["expr"]
        for p in live_panels(dashboard)
        if p["title"] == "Requests/s by model and status"
        for t in p["targets"]
    ]
    assert "$box" in expr, expr

    def shown(instance: str) -> list[dict[str, Any]]:
        values = {"$__rate_interval": "1m", "$model": ".*", "$box": instance}
        query = expr
        for name, value in values.items():
            query = query.replace(name, value)
        return prometheus.query(query)

    for box in boxes:  # a rate needs two scrapes of the series
        live.wait_until(f"box {box.port} shown", lambda b=box: shown(f"127.0.0.1:{b.port}"))
    assert shown("127.0.0.1:1") == []  # a box that is not scraped: nothing


def live_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])

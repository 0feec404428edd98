"""Shared fixtures: a running proxy in front of a simulated three-profile pool."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import ProxyProcess, proxy_config, running_proxy, wait_all_ready


@pytest.fixture(scope="module")
def demo_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """`mtp-proxy serve` with simulated off/min/max backends (time compressed 20x)."""
    workdir: Path = tmp_path_factory.mktemp("demo-proxy")
    with running_proxy(proxy_config(), workdir) as proxy:
        wait_all_ready(proxy, {"mtp-demo": 3})  # tests pin each profile
        yield proxy

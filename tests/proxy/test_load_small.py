"""A bounded version of bench/load.py for CI: 200 paced streams through the proxy, twice 4 s.

No errors, and no leaked descriptors. Idle keep-alive connections to the backends stay pooled
for 15-30 s after a load (bench/load.py waits for them: back to the baseline), so this checks the
two things a leak would break, without waiting: after a load the proxy holds at most one pooled
upstream socket per concurrent stream, and a second identical load leaves it holding no more.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.load import LoadResult, ProcessSample, hold_streams, load_config, paced_preset, settle
from tests.support.harness import ProxyProcess, running_proxy

STREAMS = 200
TOK_S = 10.0


@pytest.fixture(scope="module")
def load_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    workdir: Path = tmp_path_factory.mktemp("load")
    config = load_config(paced_preset(workdir, TOK_S), slots=STREAMS + 16, replicas=1)
    with running_proxy(config, workdir / "proxy") as proxy:
        yield proxy


async def one_load(proxy: ProxyProcess) -> LoadResult:
    load = await hold_streams(
        proxy.url, STREAMS, 4.0, stream_s=1.0, tok_s=TOK_S, ramp_s=0.5, watch_pid=proxy.process.pid
    )
    assert load.errors == [], load.errors[:5]
    # Streams of 1 s, re-opened for 4 s: every stream that started ended whole, and they were
    # re-opened (how many times depends on the machine's speed, not on the proxy).
    assert load.completed == load.started and load.completed > STREAMS, load
    assert load.events >= load.completed * TOK_S  # every token of every stream arrived
    assert load.peak is not None and load.peak.sockets >= STREAMS  # they really were concurrent
    return load


async def test_200_streams_without_errors_or_leaks(load_proxy: ProxyProcess) -> None:
    pid = load_proxy.process.pid
    before = ProcessSample.of(pid)
    await one_load(load_proxy)
    first = await settle(pid, before.fds + STREAMS, 5.0)
    assert first.sockets <= before.sockets + STREAMS, (before, first)  # only the pooled ones
    second_load = await one_load(load_proxy)
    second = await settle(pid, first.fds, 5.0)
    assert second.fds <= first.fds, (before, first, second_load.peak, second)
    assert second_load.peak is not None and second_load.peak.rss_mb < 200
    assert load_proxy.process.poll() is None

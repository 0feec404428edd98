"""gzip bombs from a client with a key, against a real proxy with the default body limit
(32 MiB): each is inflated up to the limit (then 413) in a worker thread, so other clients'
chats do not wait for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.abuse import bomb_flood, keyed_latencies
from tests.support.harness import ProxyProcess, proxy_config, running_proxy
from tests.support.rawhttp import connect, final_status, read_until_closed

KEY = "sk-bombs-0123456789"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    config = proxy_config(server={"api_keys": [KEY]})  # max_body_bytes: the default, 32 MiB
    with running_proxy(config, tmp_path_factory.mktemp("bombs")) as running:
        yield running


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send(proxy: ProxyProcess, raw: bytes) -> int | None:
    with connect(proxy.port, timeout=30) as sock:
        sock.sendall(raw)
        data, _, _ = read_until_closed(sock)
    return final_status(data)


def test_keyed_bombs_are_inflated_off_the_event_loop(proxy: ProxyProcess) -> None:
    """Each keyed bomb inflates 32 MiB before its 413; in a worker thread, the loop (and the
    other client's chat) does not wait for it."""
    quiet = keyed_latencies(proxy.url, KEY, 30)
    with bomb_flood(proxy.url, workers=3, interval_s=0.0, inflated=64 << 20, key=KEY) as answers:
        loud = keyed_latencies(proxy.url, KEY, 30)
    assert answers.get(413, 0) >= 3 and set(answers) == {413}, answers
    # Inflated on the loop, the chat's p50 went from ~16 ms to 1.4-1.9 s; in the worker thread
    # it stays at 1.5-2x on this 2-core machine (the inflation still takes one core).
    assert loud.p50 <= 3 * quiet.p50, (quiet, loud, answers)

"""The figure of docs/operations.md ("Faults"), measured with the default supervisor settings: a
hung backend is detected in 8-10 s and replaced within ~30 s. Held as the supervisor's rule (the
silences it logs) and wall times tied to those events, so that a loaded machine, where every
check ends late, keeps it green (a loaded run saw 12.0 s against a fixed 11 s bound).

A simulated backend is frozen with SIGSTOP (it keeps its port and accepts connections, but never
answers: a deadlock, a wedged GPU driver). The supervisor's health checks (/health) time out, the
backend turns `unhealthy` once none has succeeded for `unhealthy_after_s`, and `replace_after_s`
later it is killed (SIGKILL: SIGTERM would wait in vain) and a new process is started.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.settings import SupervisorSettings
from tests.support.harness import (
    ADMIN_KEY,
    ProxyProcess,
    proxy_config,
    running_proxy,
    simulator_model,
)
from tests.support.traffic import body_for, send, wait_all_ready

# docs/operations.md: "detected in 8-10 s" and "replaced within ~30 s". On an idle machine the
# wall times below land there; on a loaded one every step runs late, so the test holds the
# supervisor to its rule (the events it reports) and the wall times to those events.
EARLIEST_S = 8.0  # the last good check began at most one interval (2 s) before the freeze
SILENCE = re.compile(r"no healthy /health for ([0-9.]+)s")


def backend_row(proxy: ProxyProcess, name: str) -> dict[str, Any]:
    rows = proxy.get_json("/admin/backends", admin_key=ADMIN_KEY)[1]["backends"]
    return next(row for row in rows if row["name"] == name)


def silences(proxy: ProxyProcess, name: str) -> tuple[float, float]:
    """The silence the supervisor logged when it declared the backend unhealthy, then killed it."""
    reasons = [
        (line["to"], line["reason"])
        for line in proxy.log_lines()
        if line.get("event") == "state change" and line.get("backend") == name
    ]
    unhealthy = next(r for to, r in reasons if to == "unhealthy")
    killed = next(r for to, r in reasons if to == "stopped" and r.startswith("killed: "))
    return float(SILENCE.search(unhealthy)[1]), float(SILENCE.search(killed)[1])  # type: ignore[index]


@pytest.mark.timeout(120)
def test_a_hung_backend_is_detected_and_replaced_in_the_readme_times(tmp_path: Path) -> None:
    defaults = SupervisorSettings().model_dump()
    after, replace, interval = (
        defaults["unhealthy_after_s"], defaults["replace_after_s"], defaults["health_interval_s"]
    )  # fmt: skip
    assert (after, replace, interval) == (10.0, 15.0, 2.0)
    config = proxy_config([simulator_model()], supervisor={**defaults, "stagger_s": 0.0})
    with running_proxy(config, tmp_path) as proxy:
        wait_all_ready(proxy)
        name = "mtp-demo/max"
        hung = backend_row(proxy, name)["pid"]
        os.kill(hung, signal.SIGSTOP)
        frozen_at = time.monotonic()
        detected = replaced = None
        seen_within = math.nan
        served_meanwhile = []
        try:
            while replaced is None and time.monotonic() - frozen_at < after + replace + 40:
                asked = time.monotonic() - frozen_at
                row = backend_row(proxy, name)
                now = time.monotonic() - frozen_at
                if detected is None and row["state"] == "unhealthy":
                    detected, seen_within = now, now - asked + 0.2  # this poll's own lag
                    # Out of rotation: an unpinned short chat (cold rule: max) goes elsewhere.
                    sent = send(proxy.url, "chat", body_for("chat", stream=False))
                    served_meanwhile.append((sent.status, sent.profile))
                if row["state"] == "ready" and row["pid"] not in (None, hung):
                    replaced = now
                time.sleep(0.1)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hung, signal.SIGCONT)
        unhealthy, killed = silences(proxy, name)
        print(
            f"\nhung backend: unhealthy after {unhealthy} s of silence (seen {detected} s after "
            f"the freeze), killed after {killed} s, replaced {replaced} s after the freeze"
        )
        assert detected is not None and replaced is not None
        # The rule, in the supervisor's own words: unhealthy at the first check that ends 10 s
        # after the last good one began, not one check later (12 s is red); killed at the first
        # check 15 s after that (each check of a hung backend lasts its 2 s timeout plus the
        # machine's lateness: one more check is allowed, 4 s late is red).
        assert after <= unhealthy < after + interval, unhealthy
        assert replace <= killed - unhealthy < replace + 2 * interval, (unhealthy, killed)
        # And seen when it happened: the last good check began at most one interval before the
        # freeze (8 s), and no later than the silence it reports (plus this poll's lag).
        assert EARLIEST_S <= detected <= unhealthy + seen_within, (detected, seen_within)
        assert served_meanwhile == [(200, served_meanwhile[0][1])]
        assert served_meanwhile[0][1] != "max"
        with pytest.raises(ProcessLookupError):  # the frozen process was killed, not left behind
            os.kill(hung, 0)

"""The chat-template check (supervisor/template_check.py) on real backends, alone and supervised.

The simulator with and without its Qwen refusal; real llama-servers (marked `llama`) with the
pinned sdist's own templates: Qwen3.5 refuses a late system message (stock and patched builds
alike), DeepSeek V3.1 hoists it to the front, Gemma 4 and the tiny model's ChatML keep it in
place. A backend without /apply-template, or one that does not answer, is "unknown", with why.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from supervisor import Backend, BackendSpec, BackendState, Supervisor, SupervisorSettings
from supervisor.template_check import ChatTemplateCheck, check_chat_template
from tests.support.chat_templates import DEEPSEEK_V31, GEMMA4, QWEN35, template_args
from tests.support.llama_fixtures import (
    LLAMA,
    make_models,
    patched_llama_server_binary,
    running_llama_server,
)
from tests.support.misbehaving_backend import running_backend
from tests.support.simulator_process import simulator

S = BackendState


async def check(url: str, timeout_s: float = 5.0) -> ChatTemplateCheck:
    async with aiohttp.ClientSession() as session:
        return await check_chat_template(session, url, timeout_s=timeout_s)


async def test_the_qwen_simulator_refuses_and_the_fast_one_keeps_it_in_place() -> None:
    with simulator("--preset", "setup-b") as qwen, simulator("--preset", "fast") as fast:
        refused, in_place = await check(qwen.url), await check(fast.url)
    assert refused.late_system == "refused"
    assert refused.reason.endswith("Jinja Exception: System message must be at the beginning.")
    assert in_place.late_system == "in-place"
    assert refused.seconds < 2.0  # one render and its control: cheap on every restart


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("ok", "/apply-template answered 200 without a prompt"),  # not llama-server
        ("close-before-headers", "check failed: /apply-template: "),
        ("hang-before-headers", "check failed: no answer within 1s"),
    ],
)
async def test_a_backend_that_cannot_tell_is_unknown_with_the_reason(
    mode: str, reason: str
) -> None:
    with running_backend(mode) as url:
        started = time.monotonic()
        found = await check(url, timeout_s=1.0)
        elapsed = time.monotonic() - started
    assert found.late_system == "unknown"
    assert found.reason.startswith(reason), found.reason
    assert elapsed < 3.0  # bounded by its timeout


async def test_a_backend_without_the_route_is_unknown() -> None:
    with simulator("--preset", "setup-b") as sim:
        found = await check(sim.url + "/no-such-prefix")  # every path under it answers 404
    assert found.late_system == "unknown"
    assert found.reason == "/apply-template answered 404: not served here"


async def test_nothing_listening_is_unknown() -> None:
    found = await check("http://127.0.0.1:9")
    assert found.late_system == "unknown" and "ClientConnectorError" in found.reason


# --- inside the supervisor ---


class Seen:
    """(name, state, late_system) at every change, as the proxy's on_change callback sees it."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, BackendState, str | None]] = []

    def __call__(self, backend: Backend) -> None:
        check = backend.chat_template
        self.changes.append((backend.name, backend.state, check and check.late_system))

    def at_ready(self, name: str) -> list[str | None]:
        return [v for n, s, v in self.changes if n == name and s is S.READY]


def simulator_spec(name: str, *args: str) -> BackendSpec:
    argv = (sys.executable, "-m", "simulator", "-m", "m", "--time-scale", "50", *args)
    return BackendSpec(name, "m", name, argv)


async def test_the_supervisor_checks_before_ready_and_again_after_a_restart() -> None:
    seen = Seen()
    specs = [
        simulator_spec("qwen", "--preset", "setup-b"),
        simulator_spec("fast", "--preset", "fast"),
    ]
    settings = SupervisorSettings(ready_timeout_s=30, probe_timeout_s=5)
    with capture_logs() as logs:
        async with Supervisor(specs, settings, on_change=seen) as running:
            assert await running.wait_ready(30)
            # Already set when READY was published: a READY backend is never unchecked.
            assert seen.at_ready("qwen") == ["refused"]
            assert seen.at_ready("fast") == ["in-place"]
            snapshot = running.backend("qwen").snapshot()
            template = snapshot["chat_template"]
            assert isinstance(template, dict) and template["late_system"] == "refused"
            await running.restart("qwen")
            assert await running.wait_ready(30)
    qwen = [(s, v) for n, s, v in seen.changes if n == "qwen"]
    assert (S.STARTING, None) in qwen[1:]  # unchecked while it restarted
    assert seen.at_ready("qwen") == ["refused", "refused"]
    checked = [e for e in logs if e["event"] == "template_checked"]
    assert sorted(e["late_system"] for e in checked) == ["in-place", "refused", "refused"]
    ready = [e for e in logs if e["event"] == "state change" and e["to"] == "ready"]
    assert sorted(e["late_system"] for e in ready) == ["in-place", "refused", "refused"]
    assert all(e["draft_control"] == "none" for e in ready)  # beside the probe's answer


async def test_a_remote_backend_is_checked_at_its_first_healthy_answer() -> None:
    seen = Seen()
    with simulator("--preset", "setup-b") as sim:
        spec = BackendSpec("r", "m", "max", (), {}, url=sim.url)
        async with Supervisor([spec], SupervisorSettings(), on_change=seen) as running:
            assert await running.wait_ready(10)
    assert seen.at_ready("r") == ["refused"]


# --- real llama-servers, with the sdist's own templates ---


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models(tmp_path_factory.mktemp("tiny-models"))[LLAMA]


@pytest.fixture(scope="module")
def patched_binary() -> str:
    return patched_llama_server_binary()


@pytest.mark.llama
@pytest.mark.parametrize(
    ("template", "late_system"),
    [(QWEN35, "refused"), (DEEPSEEK_V31, "hoisted"), (GEMMA4, "in-place"), (None, "in-place")],
)
async def test_real_templates(
    model: Path, tmp_path: Path, template: str | None, late_system: str
) -> None:
    args = template_args(template) if template else []
    with running_llama_server(model, *args, log_dir=tmp_path) as server:
        found = await check(server.base_url)
    print(f"\n{template}: {found}")
    assert found.late_system == late_system, found.reason


@pytest.mark.llama
async def test_the_patched_build_refuses_alike(
    model: Path, tmp_path: Path, patched_binary: str
) -> None:
    args = template_args(QWEN35)
    with running_llama_server(model, *args, log_dir=tmp_path, binary=patched_binary) as server:
        found = await check(server.base_url)
    assert found.late_system == "refused", found.reason
    assert "System message must be at the beginning." in found.reason

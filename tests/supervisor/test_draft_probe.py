"""The draft-control probe (supervisor/draft_probe.py) on real backends, alone and supervised.

Real llama-servers (marked `llama`): the patched build honours ``"speculative.n_max"``
(per-request) with every kind of drafter, the MTP head of the tiny qwen35 model and each n-gram
type on Gemma 3 270M (which drafts only what it finds earlier in the text); the stock one ignores
it (ignored); a server that drafts nothing, with or without the field, leaves it undecided. Real
misbehaving backends (tests/support/misbehaving_backend.py) show that a probe that cannot tell says
ignored, with the reason, and never per-request.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from supervisor import Backend, BackendSpec, BackendState, Supervisor, SupervisorSettings
from supervisor.draft_probe import DraftProbe, probe_draft_control
from tests.support.llama_fixtures import (
    QWEN35_MTP_IDENTITY,
    llama_server_binary,
    make_models,
    patched_llama_server_binary,
    running_llama_server,
)
from tests.support.misbehaving_backend import running_backend
from tests.support.real_models import GEMMA3_270M, SMOLLM2_135M, real_model

S = BackendState
MTP = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3")
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# -t 1: several llama-servers share 2 cores in CI.
SERVER_ARGS = ("-t", "1", "-c", "2048", "-np", "2", "--metrics")


async def probe(url: str, *, speculative: bool = True, timeout_s: float = 20.0) -> DraftProbe:
    async with aiohttp.ClientSession() as session:
        return await probe_draft_control(
            session, url, model="m", speculative=speculative, timeout_s=timeout_s
        )


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("ok", "has no timings"),  # answers, but not like llama-server
        ("close-before-headers", "probe failed: /v1/completions: "),
        ("hang-before-headers", "no answer within 1s"),
    ],
)
async def test_a_misbehaving_backend_is_ignored_with_the_reason(mode: str, reason: str) -> None:
    with running_backend(mode) as url:
        started = time.monotonic()
        found = await probe(url, timeout_s=1.0)
        elapsed = time.monotonic() - started
    assert (found.control, found.failed) == ("ignored", True)
    assert found.reason.startswith("probe failed") and reason in found.reason, found.reason
    assert elapsed < 3.0  # bounded by its timeout


async def test_a_backend_that_refuses_the_probe_is_ignored() -> None:
    url = "http://127.0.0.1:9"  # nothing listens: connection refused
    found = await probe(url)
    assert (found.control, found.failed) == ("ignored", True)
    assert "ClientConnectorError" in found.reason


# --- real llama-servers ---


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models(tmp_path_factory.mktemp("tiny-models"))[QWEN35_MTP_IDENTITY]


@pytest.fixture(scope="module")
def patched_binary() -> str:
    return patched_llama_server_binary()


@pytest.mark.llama
async def test_patched_build_honours_the_field(
    model: Path, tmp_path: Path, patched_binary: str
) -> None:
    with running_llama_server(model, *MTP, log_dir=tmp_path, binary=patched_binary) as server:
        found = await probe(server.base_url)
    print(f"\npatched: {found}")
    assert (found.control, found.failed) == ("per-request", False), found.reason
    assert found.seconds < 5.0  # cheap enough to run on every restart


@pytest.mark.llama
async def test_stock_build_ignores_the_field(model: Path, tmp_path: Path) -> None:
    with running_llama_server(model, *MTP, log_dir=tmp_path) as server:
        found = await probe(server.base_url)
    print(f"\nstock: {found}")
    assert (found.control, found.failed) == ("ignored", False), found.reason
    assert "with speculative.n_max 0" in found.reason


@pytest.mark.llama
async def test_a_server_without_speculation_is_undecided_when_asked(
    model: Path, tmp_path: Path, patched_binary: str
) -> None:
    # As for a remote backend: nothing known about its flags, so it is asked; nothing drafted
    # tells nothing about the field.
    with running_llama_server(model, log_dir=tmp_path, binary=patched_binary) as server:
        found = await probe(server.base_url, speculative=True)
    assert (found.control, found.failed) == ("undecided", False), found.reason
    assert "drafted nothing" in found.reason


@pytest.fixture(scope="module")
def gemma() -> Path:
    return real_model(GEMMA3_270M)


@pytest.mark.llama
@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
async def test_patched_build_honours_the_field_with_each_ngram_type(
    gemma: Path, tmp_path: Path, patched_binary: str, spec_type: str
) -> None:
    # Each type with its own defaults, as a user starts it: an n-gram drafter drafts only what
    # it finds earlier in the text, which a short answer to an ordinary prompt never gives it.
    args = ("--spec-type", spec_type)
    with running_llama_server(gemma, *args, log_dir=tmp_path, binary=patched_binary) as server:
        found = await probe(server.base_url)
    print(f"\n{spec_type}: {found}")
    assert (found.control, found.failed) == ("per-request", False), found.reason


@pytest.mark.llama
async def test_stock_build_ignores_the_field_with_an_ngram_type(
    gemma: Path, tmp_path: Path
) -> None:
    with running_llama_server(gemma, "--spec-type", "ngram-mod", log_dir=tmp_path) as server:
        found = await probe(server.base_url)
    assert (found.control, found.failed) == ("ignored", False), found.reason
    assert "with speculative.n_max 0" in found.reason


@pytest.mark.llama
async def test_a_draft_model_of_another_vocabulary_leaves_it_undecided(
    gemma: Path, tmp_path: Path, patched_binary: str
) -> None:
    # llama-server refuses SmolLM2 as Gemma's draft (their vocabularies differ), logs it and
    # serves without speculation: nothing is drafted, with the field or without.
    args = ("--spec-type", "draft-simple", "-md", str(real_model(SMOLLM2_135M)))
    with running_llama_server(gemma, *args, log_dir=tmp_path, binary=patched_binary) as server:
        found = await probe(server.base_url)
        log = server.log_path.read_text(errors="replace")
    assert "draft model vocab type must match target model" in log
    assert (found.control, found.failed) == ("undecided", False), found.reason


# --- inside the supervisor ---


class Seen:
    """(state, draft_control) at every change, as the proxy's on_change callback sees it."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, BackendState, str | None]] = []

    def __call__(self, backend: Backend) -> None:
        self.changes.append((backend.name, backend.state, backend.draft_control))

    def at_ready(self, name: str) -> list[str | None]:
        return [c for n, s, c in self.changes if n == name and s is S.READY]


def supervisor(specs: list[BackendSpec], seen: Seen, probe_timeout_s: float = 5.0) -> Supervisor:
    settings = SupervisorSettings(ready_timeout_s=30, probe_timeout_s=probe_timeout_s)
    return Supervisor(specs, settings, on_change=seen)


def local_spec(name: str, binary: str, model: Path, *args: str) -> BackendSpec:
    return BackendSpec(name, "m", name, (binary, "-m", str(model), *SERVER_ARGS, *args))


@pytest.mark.llama
async def test_supervisor_probes_before_ready_and_again_after_a_restart(
    model: Path, patched_binary: str
) -> None:
    seen = Seen()
    specs = [
        local_spec("mtp", patched_binary, model, *MTP),
        local_spec("off", patched_binary, model),
        local_spec("stock", llama_server_binary(), model, *MTP),
    ]
    with capture_logs() as logs:
        async with supervisor(specs, seen) as running:
            assert await running.wait_ready(60)
            # Already set when READY was published: a READY backend is never unprobed.
            assert seen.at_ready("mtp") == ["per-request"]
            assert seen.at_ready("off") == ["none"]
            assert seen.at_ready("stock") == ["ignored"]
            snapshot = running.backend("mtp").snapshot()
            assert snapshot["draft_control"] == "per-request"
            assert "none with 0" in str(snapshot["draft_control_reason"])
            await running.restart("mtp")
            assert await running.wait_ready(60)
    # Unprobed again while it restarted, probed again before READY.
    mtp = [(s, c) for n, s, c in seen.changes if n == "mtp"]
    assert (S.STARTING, None) in mtp[1:]
    assert seen.at_ready("mtp") == ["per-request", "per-request"]
    probed = [e for e in logs if e["event"] == "backend_probed"]
    assert sorted(e["draft_control"] for e in probed) == [
        "ignored", "none", "per-request", "per-request",
    ]  # fmt: skip
    assert all(e["log_level"] == "info" and e["reason"] for e in probed), probed


@pytest.mark.llama
async def test_supervisor_tells_an_ngram_backend_that_honours_from_one_that_ignores(
    gemma: Path, patched_binary: str
) -> None:
    seen = Seen()
    ngram = ("--spec-type", "ngram-simple")
    specs = [
        local_spec("patched", patched_binary, gemma, *ngram),
        local_spec("stock", llama_server_binary(), gemma, *ngram),
    ]
    async with supervisor(specs, seen, probe_timeout_s=30) as running:
        assert await running.wait_ready(90)
        reasons = {
            name: running.backend(name).draft_control_reason for name in ("patched", "stock")
        }
    assert seen.at_ready("patched") == ["per-request"], reasons
    assert seen.at_ready("stock") == ["ignored"], reasons


async def test_a_remote_backend_that_misbehaves_is_ready_but_ignored() -> None:
    seen = Seen()
    with running_backend("ok") as url, capture_logs() as logs:
        async with supervisor([BackendSpec("r", "m", "max", (), {}, url=url)], seen) as running:
            assert await running.wait_ready(10)
            reason = running.backend("r").draft_control_reason
    assert seen.at_ready("r") == ["ignored"]
    assert reason is not None and reason.startswith("probe failed") and "no timings" in reason
    probed = [e for e in logs if e["event"] == "backend_probed"]
    assert [(e["log_level"], e["draft_control"]) for e in probed] == [("warning", "ignored")]


async def test_the_probe_timeout_bounds_the_wait_for_ready() -> None:
    seen = Seen()
    with running_backend("hang-before-headers") as url:
        spec = BackendSpec("r", "m", "max", (), {}, url=url)
        started = time.monotonic()
        async with supervisor([spec], seen, probe_timeout_s=0.5) as running:
            assert await running.wait_ready(10)
            waited = time.monotonic() - started
            reason = running.backend("r").draft_control_reason
    assert seen.at_ready("r") == ["ignored"]
    assert reason == "probe failed: no answer within 0.5s"
    assert 0.5 <= waited < 3.0


def simulator_spec(name: str, *args: str) -> BackendSpec:
    argv = (sys.executable, "-m", "simulator", "-m", "m", "--time-scale", "50", "--metrics", *args)
    return BackendSpec(name, "m", name, argv)


async def test_local_backends_are_probed_before_ready_and_again_after_a_restart() -> None:
    seen = Seen()
    specs = [simulator_spec("off"), simulator_spec("max", *MTP)]
    async with supervisor(specs, seen) as running:
        assert await running.wait_ready(30)
        await running.restart("max")
        assert await running.wait_ready(30)
        reason = running.backend("max").draft_control_reason
    assert seen.at_ready("off") == ["none"]
    # The simulator honours the field by default (per-request); with --ignore-request-draft, or
    # before it learnt the field, it drafts regardless (ignored). Either way it was asked.
    first, again = seen.at_ready("max")
    assert first == again and first in ("per-request", "ignored")
    assert reason is not None and "drafted" in reason
    restarted = [(s, c) for n, s, c in seen.changes if n == "max"][2:]
    assert restarted[:3] == [(S.STOPPING, first), (S.STOPPED, first), (S.STARTING, None)]

"""Proof that a real llama-server loads the tiny GGUF models with MTP, and the generator's command
line (the generator itself: tests/unit/test_tinygguf.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.llama_fixtures import (
    MODEL_CONFIGS,
    QWEN35_MTP_IDENTITY,
    QWEN35_MTP_RANDOM,
    LlamaServer,
    LlamaServerError,
    llama_server_binary,
    make_models,
    running_llama_server,
)
from tests.support.tinygguf.reference import bigram_text

REPO = Path(__file__).resolve().parents[2]


def test_command_line(tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    argv = [sys.executable, "-m", "tests.support.tinygguf", str(out), "--arch", "qwen35"]
    done = subprocess.run(
        [*argv, "--mtp", "identity", "--bigram"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "tiny-qwen35-seed0-mtp-identity-bigram" in done.stderr
    expected = make_models(tmp_path / "models")[QWEN35_MTP_IDENTITY]
    assert out.read_bytes() == expected.read_bytes()


CHAT_PROMPT = [{"role": "user", "content": "hello world"}]
# The chat template ends the prompt with "<|im_start|>assistant\n": the byte token "\n" (id 10)
# is the last prompt token, where a bigram model's greedy chain starts.
LAST_PROMPT_TOKEN = ord("\n")


@pytest.fixture(scope="module")
def binary() -> str:
    return llama_server_binary()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_models(tmp_path_factory.mktemp("tiny-models"))


Serve = Callable[..., LlamaServer]


@pytest.fixture
def serve(binary: str, tmp_path: Path, record_property: Any) -> Iterator[Serve]:
    """Start servers inside a test; all stop at teardown. Records ready time and RSS."""
    with ExitStack() as stack:

        def start(model: Path, *args: str) -> LlamaServer:
            server = stack.enter_context(
                running_llama_server(model, *args, log_dir=tmp_path, binary=binary)
            )
            label = f"{model.stem.rsplit('-', 1)[0]} {' '.join(args) or '(no spec)'}"
            rss = server.rss_bytes() or 0
            record_property(f"ready_ms {label}", round(server.ready_seconds * 1000, 1))
            record_property(f"rss_mib {label}", round(rss / 2**20, 1))
            print(  # visible with -s: docs/published-figures.md#tiny-models-on-a-cpu
                f"\n{label}: ready {server.ready_seconds * 1000:.0f} ms, "
                f"health {'->'.join(server.health_trace)}, RSS {rss / 2**20:.0f} MiB"
            )
            return server

        yield start


def chat(server: LlamaServer, max_tokens: int) -> dict[str, Any]:
    body = {"messages": CHAT_PROMPT, "max_tokens": max_tokens, "temperature": 0}
    status, reply = server.post_json("/v1/chat/completions", body)
    assert status == 200, reply
    return dict(reply)


def spec_counters(server: LlamaServer) -> dict[str, float]:
    """llamacpp:spec_decode_* samples keyed by name (+ position label where present)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if sample.name.startswith("llamacpp:spec_decode_"):
                pos = sample.labels.get("position")
                out[sample.name + (f"[{pos}]" if pos is not None else "")] = sample.value
    return out


def acceptance(timings: dict[str, Any]) -> float:
    return float(timings["draft_n_accepted"]) / float(timings["draft_n"])


VALID_HEALTH_TRACES = (["200"], ["503", "200"], ["refused", "200"], ["refused", "503", "200"])


@pytest.mark.llama
def test_health_answers_503_while_loading(serve: Serve, models: dict[str, Path]) -> None:
    """The listener opens before the model loads; /health says so until it is loaded.

    The MTP model loads longest (~60 ms idle); a few tries cover a CPU-starved poller.
    """
    for _ in range(3):
        server = serve(models[QWEN35_MTP_IDENTITY], "--spec-type", "draft-mtp")
        if server.loading_body is not None:
            break
    assert server.health_trace[-2:] == ["503", "200"]
    assert server.loading_body == {
        "error": {"message": "Loading model", "type": "unavailable_error", "code": 503}
    }
    status, body = server.get_json("/health")
    assert (status, body) == (200, {"status": "ok"})


@pytest.mark.llama
@pytest.mark.parametrize("key", list(MODEL_CONFIGS))
def test_server_loads_model_and_answers(serve: Serve, models: dict[str, Path], key: str) -> None:
    server = serve(models[key])
    # A starved poller may miss the short loading phase; the order is fixed though.
    assert server.health_trace in VALID_HEALTH_TRACES
    assert server.ready_seconds < 10

    reply = chat(server, 32)
    choice = reply["choices"][0]
    assert choice["message"]["content"]
    assert choice["finish_reason"] == "length"  # unprintable/EOS rows are zero: never stops
    timings = reply["timings"]
    assert timings["predicted_n"] == 32 and timings["prompt_n"] > 0
    assert timings["predicted_per_second"] > 0
    assert "draft_n" not in timings and "draft_n_accepted" not in timings
    assert spec_counters(server)["llamacpp:spec_decode_num_draft_tokens_total"] == 0
    if key == QWEN35_MTP_IDENTITY:  # the server runs the model the generator meant to write
        assert choice["message"]["content"] == bigram_text(models[key], LAST_PROMPT_TOKEN, 32)


@pytest.mark.llama
@pytest.mark.parametrize(
    "spec",
    [("--spec-draft-n-max", "3"), ("--spec-draft-n-max", "2", "--spec-draft-n-min", "1")],
    ids=["n_max3", "n_max2-n_min1"],
)
def test_identity_mtp_drafts_are_accepted(
    serve: Serve, models: dict[str, Path], spec: tuple[str, ...]
) -> None:
    model = models[QWEN35_MTP_IDENTITY]
    server = serve(model, "--spec-type", "draft-mtp", *spec)
    before = spec_counters(server)
    reply = chat(server, 64)
    timings = reply["timings"]
    print(f"identity MTP {' '.join(spec)}: {timings['draft_n_accepted']}/{timings['draft_n']}")
    assert timings["draft_n"] > 0
    assert acceptance(timings) >= 0.95
    # Speculation must not change greedy output: still the bigram chain.
    assert reply["choices"][0]["message"]["content"] == bigram_text(model, LAST_PROMPT_TOKEN, 64)

    after = spec_counters(server)
    name = "llamacpp:spec_decode_num_draft_tokens_total"
    assert after[name] - before[name] == timings["draft_n"]
    accepted = "llamacpp:spec_decode_num_accepted_tokens_total"
    assert after[accepted] - before[accepted] == timings["draft_n_accepted"]


@pytest.mark.llama
def test_random_mtp_drafts_are_rejected(serve: Serve, models: dict[str, Path]) -> None:
    server = serve(models[QWEN35_MTP_RANDOM], "--spec-type", "draft-mtp", "--spec-draft-n-max", "3")
    timings = chat(server, 64)["timings"]
    print(f"random MTP n_max 3: {timings['draft_n_accepted']}/{timings['draft_n']}")
    assert timings["draft_n"] > 0
    assert acceptance(timings) < 0.2


@pytest.mark.llama
def test_synthetic_rates_set_acceptance(serve: Serve, models: dict[str, Path]) -> None:
    rates = (0.9, 0.8, 0.7)
    args = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3")
    server = serve(
        models[QWEN35_MTP_RANDOM], *args, "--spec-synth-rates", ",".join(map(str, rates))
    )
    timings = chat(server, 512)["timings"]
    counters = spec_counters(server)
    drafts = counters["llamacpp:spec_decode_num_drafts_total"]
    per_pos = [
        counters[f"llamacpp:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] / drafts
        for i in range(3)
    ]
    print(
        f"synthetic {rates}: {timings['draft_n_accepted']}/{timings['draft_n']} = "
        f"{acceptance(timings):.3f}, per position {[round(p, 3) for p in per_pos]}"
    )
    # Unconditional per-position rates: expected accepted share = mean(rates) = 0.8.
    assert 0.65 <= acceptance(timings) <= 0.95
    for observed, rate in zip(per_pos, rates, strict=True):
        assert abs(observed - rate) < 0.15


@pytest.mark.llama
def test_synthetic_rates_must_match_n_max(
    binary: str, models: dict[str, Path], tmp_path: Path
) -> None:
    args = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-synth-rates", "0.9,0.8")
    model = models[QWEN35_MTP_RANDOM]
    with (
        pytest.raises(LlamaServerError, match="must contain 3 values, got 2") as err,
        running_llama_server(model, *args, log_dir=tmp_path, binary=binary),
    ):
        pass
    assert "exited with 1" in str(err.value)

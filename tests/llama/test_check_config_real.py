"""`check-config` on speculative types with the real parts: the patched llama-server's own
--help, and the real small models' vocabularies (Gemma 3 270M, SmolLM2 135M). SmolLM2 as
Gemma's draft is what llama-server serves without speculation (it logs "draft model vocab type
must match target model": tests/llama/test_auto_real_models.py); Gemma as its own draft drafts
(tests/llama/test_spec_types.py). Crafted kinds (EAGLE3, DFlash): tests/proxy/
test_check_config_drafts.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tomli_w

from tests.support.cli import run_cli
from tests.support.llama_fixtures import patched_llama_server_binary
from tests.support.real_models import GEMMA3_270M, SMOLLM2_135M, real_model

pytestmark = pytest.mark.llama

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


@pytest.fixture(scope="module")
def binary() -> str:
    return patched_llama_server_binary()


def check(tmp_path: Path, binary: str, profiles: list[dict[str, object]]) -> tuple[int, str]:
    model = {"name": "gemma", "binary": binary, "model_path": str(real_model(GEMMA3_270M))}
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps({"models": [{**model, "profiles": profiles}]}))
    result = run_cli("check-config", "--config", str(config))
    return result.returncode, result.stderr + result.stdout


def test_smollm2_as_gemmas_draft_is_refused_naming_each_difference(
    tmp_path: Path, binary: str
) -> None:
    smollm2 = real_model(SMOLLM2_135M)
    profile = {"name": "max", "spec_type": "draft-simple", "draft_model": str(smollm2)}
    status, said = check(tmp_path, binary, [{"name": "off"}, profile])
    assert status == 2, said
    (problem,) = [line for line in said.splitlines() if line.startswith("  - ")]
    assert problem.startswith(
        f"  - models.0.profiles.1.draft_model (gemma/max): the draft model {smollm2} does not "
        f"share the vocabulary of {real_model(GEMMA3_270M)} (model vs draft: "
        "tokenizer.ggml.model 'llama' vs 'gpt2'; tokenizer.ggml.add_bos_token True vs False; "
        "vocabulary size 262,144 vs 49,152 tokens (more than 128 apart); token 5 "
    )
    assert problem.endswith(
        'so llama-server would serve without speculation (its log: "draft model vocab type '
        'must match target model"). Use a draft model of the same family and tokenizer'
    )


def test_gemma_as_its_own_draft_is_accepted(tmp_path: Path, binary: str) -> None:
    gemma = real_model(GEMMA3_270M)
    profile = {"name": "max", "spec_type": "draft-simple", "draft_model": str(gemma)}
    status, said = check(tmp_path, binary, [{"name": "off"}, profile])
    assert status == 0, said
    assert f"--spec-type draft-simple -md {gemma}" in said
    assert "warning" not in said  # the binary's help was read


def test_every_ngram_type_of_the_binary_is_accepted_and_an_unknown_one_refused(
    tmp_path: Path, binary: str
) -> None:
    profiles = [{"name": "off"}] + [
        {"name": name, "spec_type": name, "draft_n_max": 16} for name in NGRAM_TYPES
    ]
    status, said = check(tmp_path, binary, profiles)
    assert status == 0, said
    for name in NGRAM_TYPES:
        assert f"--spec-type {name} --spec-draft-n-max 16" in said
    bogus = [{"name": "off"}, {"name": "max", "spec_type": "ngram-bogus"}]
    status, said = check(tmp_path, binary, bogus)
    assert status == 2
    assert (
        f"models.0.profiles.1 (gemma/max): spec_type 'ngram-bogus' is not one {binary} knows "
        '(it would exit with "unknown speculative type: ngram-bogus"); it knows none, '
        "draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple, "
        "ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache"
    ) in said
    # What it says the server would do is what the server does.
    started = subprocess.run(
        [binary, "-m", str(real_model(GEMMA3_270M)), "--spec-type", "ngram-bogus", "-t", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode == 1
    assert "unknown speculative type: ngram-bogus" in started.stderr + started.stdout

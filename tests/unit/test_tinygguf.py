"""The tiny GGUF generator: deterministic tiny files of the expected layout, whose MTP block
computes what the trunk does (a real llama-server loads them: tests/llama/test_tinygguf.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

from tests.support.llama_fixtures import (
    LLAMA,
    MODEL_CONFIGS,
    QWEN35_MTP_IDENTITY,
    QWEN35_MTP_RANDOM,
    make_models,
)
from tests.support.tinygguf import (
    LlamaConfig,
    Mtp,
    Qwen35Config,
    build_vocab,
    write_llama,
    write_qwen35,
)
from tests.support.tinygguf.reference import bigram_next, rmsnorm, tensors
from tests.support.tinygguf.tokenizer import SPECIAL_TOKENS, byte_to_unicode

MAX_BYTES = 1_000_000


def _write(path: Path, cfg: LlamaConfig | Qwen35Config) -> Path:
    return write_llama(path, cfg) if isinstance(cfg, LlamaConfig) else write_qwen35(path, cfg)


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


@pytest.mark.parametrize("key", list(MODEL_CONFIGS))
def test_models_are_deterministic_tiny_and_fast(tmp_path: Path, key: str) -> None:
    cfg = MODEL_CONFIGS[key]
    started = time.perf_counter()
    first = _write(tmp_path / "a.gguf", cfg)
    elapsed = time.perf_counter() - started
    second = _write(tmp_path / "b.gguf", cfg)
    assert first.read_bytes() == second.read_bytes()
    assert first.stat().st_size < MAX_BYTES
    assert elapsed < 1.0
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves nothing behind


def test_seed_changes_weights_not_vocabulary(tmp_path: Path) -> None:
    a = tensors(write_llama(tmp_path / "a.gguf", LlamaConfig(seed=1)))
    b = tensors(write_llama(tmp_path / "b.gguf", LlamaConfig(seed=2)))
    assert not np.array_equal(a["output.weight"], b["output.weight"])
    tokens = [
        _field(GGUFReader(tmp_path / n), "tokenizer.ggml.tokens") for n in ("a.gguf", "b.gguf")
    ]
    assert tokens[0] == tokens[1]


def test_vocab_layout() -> None:
    vocab = build_vocab(64)
    b2u = byte_to_unicode()
    assert sorted(b2u) == list(range(256)) and len(set(b2u.values())) == 256
    assert vocab.tokens[:256] == tuple(b2u[b] for b in range(256))
    assert vocab.tokens[-3:] == SPECIAL_TOKENS
    assert vocab.size == 256 + len(vocab.merges) + 3
    known = set(vocab.tokens)
    for merge in vocab.merges:  # a merge may only join tokens that already exist
        a, b = merge.split(" ")
        assert {a, b, a + b} <= known
    assert not any(vocab.printable[i] for i in vocab.special_ids.values())
    assert vocab.printable[ord("a")] and not vocab.printable[0]


def test_output_head_never_picks_unprintable_tokens(tmp_path: Path) -> None:
    t = tensors(write_llama(tmp_path / "m.gguf"))
    mask = build_vocab(64).printable_mask()
    assert not t["output.weight"][~mask].any()
    assert np.abs(t["output.weight"][mask]).min(axis=1).max() > 0


@pytest.mark.parametrize("mtp", list(Mtp))
def test_qwen35_layout(tmp_path: Path, mtp: Mtp) -> None:
    path = write_qwen35(tmp_path / "q.gguf", Qwen35Config(mtp=mtp))
    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    assert _field(reader, "general.architecture") == "qwen35"
    n_mtp = 0 if mtp is Mtp.NONE else 1
    assert _field(reader, "qwen35.block_count") == 2 + n_mtp
    assert _field(reader, "qwen35.nextn_predict_layers") == (n_mtp or None)
    assert "blk.0.ssm_a" in names and "blk.1.attn_q.weight" in names  # delta net, attention
    nextn = {f"blk.2.nextn.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "shared_head_norm")}
    assert (nextn <= names) == bool(n_mtp)


def test_identity_mtp_reproduces_the_bigram_map(tmp_path: Path) -> None:
    """Run the MTP block's math in numpy: it must predict what the bigram trunk predicts."""
    t = tensors(_write(tmp_path / "q.gguf", MODEL_CONFIGS[QWEN35_MTP_IDENTITY]))
    for name in ("blk.2.attn_output.weight", "blk.2.ffn_down.weight", "blk.0.ssm_out.weight"):
        assert not t[name].any()
    embd = t["token_embd.weight"]
    hidden = np.random.default_rng(7).standard_normal(embd.shape).astype(np.float32)
    concat = np.concatenate([rmsnorm(embd, 1e-6), rmsnorm(hidden, 1e-6)], axis=1)
    mtp_h = rmsnorm(concat @ t["blk.2.nextn.eh_proj.weight"].T, 1e-6)  # branches add zero
    mtp_next = np.argmax(rmsnorm(mtp_h, 1e-6) @ t["output.weight"].T, axis=1)
    assert np.array_equal(mtp_next, bigram_next(t))


def test_make_models_is_cached(tmp_path: Path) -> None:
    first = make_models(tmp_path)
    assert set(first) == {LLAMA, QWEN35_MTP_RANDOM, QWEN35_MTP_IDENTITY}
    mtimes = {k: p.stat().st_mtime_ns for k, p in first.items()}
    assert make_models(tmp_path) == first
    assert {k: p.stat().st_mtime_ns for k, p in first.items()} == mtimes

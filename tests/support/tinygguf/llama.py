"""Tiny random-weight `llama` architecture GGUF (the plainest model llama-server loads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFWriter

from .tokenizer import Vocab, add_tokenizer, build_vocab
from .weights import Weights, add_output_head, write_gguf

ARCH = "llama"


@dataclass(frozen=True)
class LlamaConfig:
    seed: int = 0
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int | None = None  # None: same as n_head (no GQA)
    n_ff: int = 128
    n_ctx: int = 2048
    n_merges: int = 64
    # Zero every residual branch (attn_output, ffn_down): the next token then depends only on
    # the current one, so greedy output falls into a short cycle (good for ngram speculation).
    bigram: bool = False
    # Same seed plus a little noise from another seed: a draft model with partial acceptance.
    noise_seed: int | None = None
    noise: float = 0.0
    name: str | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head_kv or self.n_head

    def model_name(self) -> str:
        return self.name or f"tiny-llama-seed{self.seed}{'-bigram' if self.bigram else ''}"


def _add_hparams(writer: GGUFWriter, cfg: LlamaConfig) -> None:
    writer.add_name(cfg.model_name())
    writer.add_context_length(cfg.n_ctx)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)


def _add_block(writer: GGUFWriter, w: Weights, cfg: LlamaConfig, i: int) -> None:
    branch = 0.0 if cfg.bigram else 1.0
    e, hd = cfg.n_embd, cfg.head_dim
    writer.add_tensor(f"blk.{i}.attn_norm.weight", w.ones(e))
    writer.add_tensor(f"blk.{i}.attn_q.weight", w.normal((cfg.n_head * hd, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_k.weight", w.normal((cfg.kv_heads * hd, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_v.weight", w.normal((cfg.kv_heads * hd, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_output.weight", w.normal((e, cfg.n_head * hd), 0.2, branch))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", w.ones(e))
    writer.add_tensor(f"blk.{i}.ffn_gate.weight", w.normal((cfg.n_ff, e), 0.2))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", w.normal((cfg.n_ff, e), 0.2))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", w.normal((e, cfg.n_ff), 0.2, branch))


def write_llama(path: Path, cfg: LlamaConfig | None = None) -> Path:
    cfg = cfg or LlamaConfig()
    vocab: Vocab = build_vocab(cfg.n_merges)
    weights = Weights(cfg.seed, cfg.noise_seed, cfg.noise)

    def fill(writer: GGUFWriter) -> None:
        _add_hparams(writer, cfg)
        add_tokenizer(writer, vocab)
        add_output_head(writer, weights, vocab, cfg.n_embd)
        for i in range(cfg.n_layer):
            _add_block(writer, weights, cfg, i)

    return write_gguf(path, ARCH, fill)

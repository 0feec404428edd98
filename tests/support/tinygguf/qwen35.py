"""Tiny random-weight `qwen35` GGUF (Qwen3.5 hybrid) with an optional MTP/NextN block.

qwen35 is the family that ships real MTP GGUFs, so it is what `--spec-type draft-mtp` needs.
Layout: `n_layer` trunk blocks (every `attn_interval`-th one gated full attention, the others
gated delta net), then one MTP block at index `n_layer` (`block_count = n_layer + 1`,
`qwen35.nextn_predict_layers = 1`).

MTP variants:
- random: an MTP block with random weights; its drafts are practically never accepted.
- identity: combined with `bigram=True`, the MTP block computes exactly the trunk's
  next-token map, so drafts are (practically) always accepted.
- none: no MTP block; `--spec-type draft-mtp` has nothing to draft with.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .tokenizer import add_tokenizer, build_vocab
from .weights import F32, Weights, add_output_head, write_gguf

ARCH = "qwen35"
SSM_CONV_KERNEL = 4


class Mtp(StrEnum):
    NONE = "none"
    RANDOM = "random"
    IDENTITY = "identity"


@dataclass(frozen=True)
class Qwen35Config:
    seed: int = 0
    n_layer: int = 2  # trunk blocks, MTP block not included
    attn_interval: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx: int = 2048
    n_merges: int = 64
    ssm_state: int = 16  # head_k_dim == head_v_dim
    ssm_groups: int = 2  # key heads
    ssm_v_heads: int = 4  # value heads (dt_rank)
    mtp: Mtp = Mtp.RANDOM
    # Zero every residual-branch output (ssm_out, attn_output, ffn_down): the trunk becomes the
    # pure bigram map next = argmax(output . rmsnorm(embd(cur))), which an MTP block can copy.
    bigram: bool = False

    @property
    def key_dim(self) -> int:
        return self.ssm_state * self.ssm_groups

    @property
    def value_dim(self) -> int:
        return self.ssm_state * self.ssm_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def n_mtp(self) -> int:
        return 0 if self.mtp is Mtp.NONE else 1

    def is_attention(self, i: int) -> bool:
        return (i + 1) % self.attn_interval == 0

    def model_name(self) -> str:
        bigram = "-bigram" if self.bigram else ""
        return f"tiny-qwen35-seed{self.seed}-mtp-{self.mtp.value}{bigram}"


def _rope_sections(n_rot: int) -> list[int]:
    # Interleaved M-RoPE wants 4 sections; text-only positions make their split irrelevant,
    # but they must add up to at most n_rot / 2.
    return [n_rot // 2 - 2 * (n_rot // 6), n_rot // 6, n_rot // 6, 0]


def _add_hparams(writer: GGUFWriter, cfg: Qwen35Config) -> None:
    writer.add_name(cfg.model_name())
    writer.add_context_length(cfg.n_ctx)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + cfg.n_mtp)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_array(f"{ARCH}.rope.dimension_sections", _rope_sections(cfg.head_dim))
    writer.add_rope_freq_base(10_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{ARCH}.ssm.conv_kernel", SSM_CONV_KERNEL)
    writer.add_uint32(f"{ARCH}.ssm.inner_size", cfg.value_dim)
    writer.add_uint32(f"{ARCH}.ssm.state_size", cfg.ssm_state)
    writer.add_uint32(f"{ARCH}.ssm.time_step_rank", cfg.ssm_v_heads)
    writer.add_uint32(f"{ARCH}.ssm.group_count", cfg.ssm_groups)
    writer.add_uint32(f"{ARCH}.full_attention_interval", cfg.attn_interval)
    if cfg.n_mtp:
        writer.add_uint32(f"{ARCH}.nextn_predict_layers", cfg.n_mtp)


def _add_norms(writer: GGUFWriter, w: Weights, cfg: Qwen35Config, i: int) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", w.ones(cfg.n_embd))
    writer.add_tensor(f"blk.{i}.post_attention_norm.weight", w.ones(cfg.n_embd))


def _add_attention(
    writer: GGUFWriter, w: Weights, cfg: Qwen35Config, i: int, out_scale: float
) -> None:
    e, hd = cfg.n_embd, cfg.head_dim
    # attn_q holds the query and its output gate side by side, hence 2 x n_head.
    writer.add_tensor(f"blk.{i}.attn_q.weight", w.normal((2 * cfg.n_head * hd, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_k.weight", w.normal((cfg.n_head_kv * hd, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_v.weight", w.normal((cfg.n_head_kv * hd, e), 0.2))
    out = w.normal((e, cfg.n_head * hd), 0.2, out_scale)
    writer.add_tensor(f"blk.{i}.attn_output.weight", out)
    writer.add_tensor(f"blk.{i}.attn_q_norm.weight", w.ones(hd))
    writer.add_tensor(f"blk.{i}.attn_k_norm.weight", w.ones(hd))


def _add_delta_net(
    writer: GGUFWriter, w: Weights, cfg: Qwen35Config, i: int, out_scale: float
) -> None:
    e, nv = cfg.n_embd, cfg.ssm_v_heads
    writer.add_tensor(f"blk.{i}.attn_qkv.weight", w.normal((cfg.conv_dim, e), 0.2))
    writer.add_tensor(f"blk.{i}.attn_gate.weight", w.normal((cfg.value_dim, e), 0.2))
    conv = w.normal((cfg.conv_dim, SSM_CONV_KERNEL), 0.3)
    writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", conv)
    writer.add_tensor(f"blk.{i}.ssm_dt.bias", w.normal(nv, 0.1))
    # A must be negative for the state to decay rather than blow up.
    writer.add_tensor(f"blk.{i}.ssm_a", -np.abs(w.normal(nv, 1.0)))
    writer.add_tensor(f"blk.{i}.ssm_beta.weight", w.normal((nv, e), 0.2))
    writer.add_tensor(f"blk.{i}.ssm_alpha.weight", w.normal((nv, e), 0.2))
    writer.add_tensor(f"blk.{i}.ssm_norm.weight", w.ones(cfg.ssm_state))
    out = w.normal((e, cfg.value_dim), 0.2, out_scale)
    writer.add_tensor(f"blk.{i}.ssm_out.weight", out)


def _add_ffn(writer: GGUFWriter, w: Weights, cfg: Qwen35Config, i: int, out_scale: float) -> None:
    e, ff = cfg.n_embd, cfg.n_ff
    writer.add_tensor(f"blk.{i}.ffn_gate.weight", w.normal((ff, e), 0.2))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", w.normal((ff, e), 0.2))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", w.normal((e, ff), 0.2, out_scale))


def _eh_proj(w: Weights, cfg: Qwen35Config, identity: bool) -> F32:
    """eh_proj maps concat(enorm(embd(token)), hnorm(hidden)) [2E] back to E.

    The identity variant keeps only the token half, so with zeroed branches the MTP block
    predicts output . rmsnorm(embd(token)): the bigram trunk's own next-token map.
    """
    e = cfg.n_embd
    random = w.normal((e, 2 * e), 0.2)  # drawn either way: same seed, same other tensors
    if not identity:
        return random
    return np.concatenate([np.eye(e), np.zeros((e, e))], axis=1).astype(np.float32)


def _add_mtp_block(writer: GGUFWriter, w: Weights, cfg: Qwen35Config) -> None:
    i = cfg.n_layer
    identity = cfg.mtp is Mtp.IDENTITY
    branch = 0.0 if identity else 1.0
    _add_norms(writer, w, cfg, i)
    _add_attention(writer, w, cfg, i, branch)
    _add_ffn(writer, w, cfg, i, branch)
    writer.add_tensor(f"blk.{i}.nextn.eh_proj.weight", _eh_proj(w, cfg, identity))
    writer.add_tensor(f"blk.{i}.nextn.enorm.weight", w.ones(cfg.n_embd))
    writer.add_tensor(f"blk.{i}.nextn.hnorm.weight", w.ones(cfg.n_embd))
    writer.add_tensor(f"blk.{i}.nextn.shared_head_norm.weight", w.ones(cfg.n_embd))


def write_qwen35(path: Path, cfg: Qwen35Config | None = None) -> Path:
    cfg = cfg or Qwen35Config()
    vocab = build_vocab(cfg.n_merges)
    weights = Weights(cfg.seed)
    branch = 0.0 if cfg.bigram else 1.0

    def fill(writer: GGUFWriter) -> None:
        _add_hparams(writer, cfg)
        add_tokenizer(writer, vocab)
        add_output_head(writer, weights, vocab, cfg.n_embd)
        for i in range(cfg.n_layer):
            _add_norms(writer, weights, cfg, i)
            if cfg.is_attention(i):
                _add_attention(writer, weights, cfg, i, branch)
            else:
                _add_delta_net(writer, weights, cfg, i, branch)
            _add_ffn(writer, weights, cfg, i, branch)
        if cfg.n_mtp:
            _add_mtp_block(writer, weights, cfg)

    return write_gguf(path, ARCH, fill)

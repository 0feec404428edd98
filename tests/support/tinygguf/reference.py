"""What a tiny model computes, in numpy: the tests' reference for llama-server's answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader

from .tokenizer import build_vocab, byte_to_unicode

F32 = npt.NDArray[np.float32]


def tensors(path: Path) -> dict[str, F32]:
    return {t.name: np.asarray(t.data, dtype=np.float32) for t in GGUFReader(path).tensors}


def rmsnorm(x: F32, eps: float) -> F32:
    scale: F32 = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x / scale


def bigram_next(t: dict[str, F32], eps: float = 1e-6) -> npt.NDArray[np.int64]:
    """next[token] of a bigram trunk: every residual branch is zero, so h = embd(token)."""
    logits = rmsnorm(t["token_embd.weight"], eps) @ t["output.weight"].T
    nxt: npt.NDArray[np.int64] = np.argmax(logits, axis=1)
    return nxt


def bigram_text(model: Path, first: int, n: int) -> str:
    """Greedy output of a bigram model from token `first`, computed in numpy."""
    nxt = bigram_next(tensors(model))
    vocab = build_vocab(64)
    u2b = {c: b for b, c in byte_to_unicode().items()}
    out: list[int] = []
    tok = first
    for _ in range(n):
        tok = int(nxt[tok])
        out.extend(u2b[c] for c in vocab.tokens[tok])
    return bytes(out).decode()

"""Seeded weight factory and the GGUF file plumbing the architectures share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
from gguf import GGUFWriter

from .tokenizer import Vocab

F32 = npt.NDArray[np.float32]
GGUF_FILE_TYPE_ALL_F32 = 0


class Weights:
    """Draws every random tensor from one seeded stream, in call order.

    With `noise_seed` set, each tensor gets `noise` x (a second seeded normal draw) added before
    scaling: the same `seed` with a little noise gives a draft model that agrees with its target
    only part of the time, and the agreement grows as `noise` shrinks.
    """

    def __init__(self, seed: int, noise_seed: int | None = None, noise: float = 0.0) -> None:
        self._rng = np.random.default_rng(seed)
        self._noise_rng = None if noise_seed is None else np.random.default_rng(noise_seed)
        self._noise = noise

    def normal(self, shape: int | tuple[int, ...], std: float, scale: float = 1.0) -> F32:
        """numpy shape is (out, in); GGUFWriter stores it reversed, as ggml expects."""
        x = self._rng.standard_normal(shape)
        if self._noise_rng is not None:
            x = x + self._noise * self._noise_rng.standard_normal(shape)
        return (x * (std * scale)).astype(np.float32)

    @staticmethod
    def ones(n: int) -> F32:
        return np.ones(n, dtype=np.float32)


def add_output_head(writer: GGUFWriter, weights: Weights, vocab: Vocab, n_embd: int) -> None:
    """Token embedding, final norm and LM head.

    Rows of the LM head for control and non-printable tokens are zero, so greedy decoding never
    picks them: output is printable text and a request runs until max_tokens (never EOS).
    """
    writer.add_tensor("token_embd.weight", weights.normal((vocab.size, n_embd), 1.0))
    writer.add_tensor("output_norm.weight", weights.ones(n_embd))
    head = weights.normal((vocab.size, n_embd), 0.5)
    head[~vocab.printable_mask()] = 0.0
    writer.add_tensor("output.weight", head)


def write_gguf(path: Path, arch: str, fill: Callable[[GGUFWriter], None]) -> Path:
    """Write atomically: concurrent test workers may generate the same cached file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = GGUFWriter(tmp, arch)
    try:
        writer.add_file_type(GGUF_FILE_TYPE_ALL_F32)
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, path)
    return path

"""Tiny, deterministic, random-weight GGUF models that a real llama-server loads.

They let end-to-end tests run llama-server (with MTP speculation) on CI machines that cannot
download a model: every file is < 1 MB, all F32, and written in milliseconds.

    python -m tests.support.tinygguf OUT.gguf --arch qwen35 --mtp identity --bigram
"""

from .drafts import write_draft_head
from .llama import LlamaConfig, write_llama
from .qwen35 import Mtp, Qwen35Config, write_qwen35
from .tokenizer import Vocab, build_vocab

__all__ = [
    "LlamaConfig",
    "Mtp",
    "Qwen35Config",
    "Vocab",
    "build_vocab",
    "write_draft_head",
    "write_llama",
    "write_qwen35",
]

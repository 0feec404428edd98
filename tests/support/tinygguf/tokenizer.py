"""A tiny GPT-2 style byte-level BPE vocabulary and its GGUF tokenizer metadata.

Every tiny model shares this vocabulary (it does not depend on the weight seed), so any two
models are draft-compatible for `--spec-type draft-simple -md`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from gguf import GGUFWriter, TokenType

# Merges are learned from this text, so common words become single tokens and greedy output
# looks like (nonsense) words rather than single bytes.
CORPUS = (
    "the quick brown fox jumps over the lazy dog. hello world! this is a tiny test model "
    "for llama server integration tests. the model has random weights and a small byte "
    "level bpe tokenizer. speculative decoding drafts tokens and the target model verifies "
    "them. hello hello hello world world the the the and and in in on on of of to to is is "
    "def main(): return 0\nimport os\nprint('hello')\n"
) * 3

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

BOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (BOS_TOKEN, IM_START_TOKEN, EOS_TOKEN)

Word = tuple[str, ...]


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    types: tuple[TokenType, ...]
    merges: tuple[str, ...]
    printable: tuple[bool, ...]  # token decodes to printable ASCII (or newline)
    special_ids: dict[str, int]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def printable_mask(self) -> npt.NDArray[np.bool_]:
        return np.array(self.printable, dtype=np.bool_)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what the "gpt2" tokenizer expects)."""
    visible = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in visible}
    shifted = [b for b in range(256) if b not in mapping]
    for n, b in enumerate(shifted):
        mapping[b] = chr(256 + n)
    return dict(sorted(mapping.items()))


def _word_counts(text: str, b2u: dict[int, str]) -> Counter[Word]:
    # GPT-2 pre-tokenization attaches the leading space to the word ("Ġword").
    counts: Counter[Word] = Counter()
    for i, word in enumerate(text.split(" ")):
        raw = (" " if i else "") + word
        counts[tuple(b2u[b] for b in raw.encode())] += 1
    return counts


def _best_pair(words: Counter[Word]) -> tuple[str, str] | None:
    pairs: Counter[tuple[str, str]] = Counter()
    for word, count in words.items():
        for pair in itertools.pairwise(word):
            pairs[pair] += count
    if not pairs:
        return None
    # Ties break on the pair itself so the vocabulary never depends on dict ordering.
    return max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _apply_merge(word: Word, pair: tuple[str, str]) -> Word:
    out: list[str] = []
    i = 0
    while i < len(word):
        if word[i : i + 2] == pair:
            out.append(pair[0] + pair[1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _learn_merges(n_merges: int, b2u: dict[int, str]) -> list[tuple[str, str]]:
    words = _word_counts(CORPUS, b2u)
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pair = _best_pair(words)
        if pair is None:
            break
        merges.append(pair)
        merged: Counter[Word] = Counter()
        for word, count in words.items():
            merged[_apply_merge(word, pair)] += count
        words = merged
    return merges


def build_vocab(n_merges: int = 64) -> Vocab:
    """256 byte tokens, then one token per learned merge, then the control tokens."""
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    printable = [32 <= b <= 126 or b == 10 for b in range(256)]
    merges = _learn_merges(n_merges, b2u)
    known = set(tokens)
    for a, b in merges:
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
            printable.append(True)  # merges of printable bytes only: the corpus is ASCII
    types = [TokenType.NORMAL] * len(tokens)
    special_ids: dict[str, int] = {}
    for special in SPECIAL_TOKENS:
        special_ids[special] = len(tokens)
        tokens.append(special)
        types.append(TokenType.CONTROL)
        printable.append(False)
    return Vocab(
        tokens=tuple(tokens),
        types=tuple(types),
        merges=tuple(f"{a} {b}" for a, b in merges),
        printable=tuple(printable),
        special_ids=special_ids,
    )


def add_tokenizer(writer: GGUFWriter, vocab: Vocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.types))
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.special_ids[BOS_TOKEN])
    writer.add_eos_token_id(vocab.special_ids[EOS_TOKEN])
    writer.add_pad_token_id(vocab.special_ids[BOS_TOKEN])
    # ChatML prompts carry their own markers; a BOS in front would only shift positions.
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    writer.add_vocab_size(vocab.size)

"""The vocabulary comparison of a draft model and its target, as llama.cpp's
common_speculative_are_compatible makes it (pure; on real and tiny files through check-config:
tests/llama/test_check_config_real.py, tests/proxy/test_check_config_drafts.py)."""

from __future__ import annotations

from dataclasses import replace

from proxy.plans.draft_models import compare_vocabularies
from proxy.plans.gguf import Vocabulary

TOKENS = tuple(f"t{i}".encode() for i in range(1000))
SPM = Vocabulary("llama", add_bos=None, add_eos=None, bos=1, eos=2, tokens=TOKENS)
BPE = Vocabulary("gpt2", add_bos=False, add_eos=None, bos=0, eos=0, tokens=TOKENS)


def test_the_same_vocabulary_drafts() -> None:
    assert compare_vocabularies(SPM, SPM) == []
    assert compare_vocabularies(BPE, replace(BPE, model="gemma4")) == []  # both BPE to llama.cpp


def test_each_difference_is_named_with_both_values() -> None:
    other = Vocabulary("gpt2", add_bos=False, add_eos=None, bos=7, eos=8, tokens=TOKENS[:500])
    assert compare_vocabularies(SPM, other) == [
        "tokenizer.ggml.model 'llama' vs 'gpt2'",
        "tokenizer.ggml.add_bos_token True vs False",  # SPM adds BOS when the file says nothing
        "vocabulary size 1,000 vs 500 tokens (more than 128 apart)",
    ]


def test_the_ids_of_added_tokens_only_are_compared() -> None:
    # SPM adds BOS (by default), not EOS: a different BOS id refuses, a different EOS id not.
    assert compare_vocabularies(SPM, replace(SPM, bos=9)) == ["tokenizer.ggml.bos_token_id 1 vs 9"]
    assert compare_vocabularies(SPM, replace(SPM, eos=9)) == []
    added = replace(SPM, add_eos=True)
    assert compare_vocabularies(added, replace(added, eos=9)) == [
        "tokenizer.ggml.eos_token_id 2 vs 9"
    ]
    # BPE's default depends on its pre-tokenizer, not read here: not judged (never refused).
    assert compare_vocabularies(replace(BPE, add_bos=None), replace(BPE, add_bos=None, bos=5)) == []


def test_sizes_within_128_and_the_first_tokens_may_differ() -> None:
    longer = replace(SPM, tokens=TOKENS + tuple(b"x" for _ in range(128)))
    assert compare_vocabularies(SPM, longer) == []
    assert compare_vocabularies(SPM, replace(longer, tokens=(*longer.tokens, b"y"))) == [
        "vocabulary size 1,000 vs 1,129 tokens (more than 128 apart)"
    ]
    specials = replace(SPM, tokens=(b"<pad>", b"<s>", b"</s>", b"<unk>", b"<mask>", *TOKENS[5:]))
    assert compare_vocabularies(SPM, specials) == []  # ids 0-4: llama.cpp starts at 5
    changed = replace(SPM, tokens=(*TOKENS[:5], b"other", *TOKENS[6:]))
    assert compare_vocabularies(SPM, changed) == ["token 5 't5' vs 'other'"]

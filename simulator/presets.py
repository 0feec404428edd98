"""Calibration presets: one TOML data file per measured setup (simulator/presets/NAME.toml).

A preset holds every constant of the performance model (see MODEL.md), so a new GPU/model pair
is a new data file, not new code.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class DecodeCost:
    t0_ms: float  # one plain decode step at empty context
    ctx_half: float  # context (tokens) at which a plain step takes twice as long
    batch_growth: float  # extra step time per additional decoding slot (fraction of a step)


@dataclass(frozen=True)
class SpecCost:
    step_overhead: float  # per verification step, drafter on (fraction of a plain step)
    draft_cost: float  # per drafted token at empty context (fraction of a plain step)
    verify_cost_per_ktok: float  # per drafted token, per 1000 tokens of context
    concurrency_growth: float  # growth of the speculative overhead per extra decoding slot
    spill_n_max: int  # n_max from which the draft buffers spill VRAM (0: never)
    spill_slowdown: float  # step-time multiplier once spilled
    # Optional (0: no such cost), so older preset files stay valid:
    concurrency_split: float = 0.0  # one-off growth of the speculative overhead once 2+ decode
    depth0_cost: float = 0.0  # a depth-0 request in an MTP process (fraction of a plain step)
    mixed_depth_pass: float = 0.0  # per extra draft depth among decoding slots (plain steps)


@dataclass(frozen=True)
class Acceptance:
    code: float  # mean first-position acceptance at empty context, code
    prose: float  # same, prose / chat
    floor: float  # acceptance that long contexts tend to
    ctx_half: float  # context at which acceptance is half-way down to the floor
    latent_sigma: float  # spread (log) of the per-session latent multiplier
    easy: float  # acceptance of a token in an "easy" stretch
    hard: float  # acceptance of a token in a "hard" stretch
    confidence_easy_min: float  # drafter confidence in easy stretches ~ U[this, 1]
    confidence_hard_max: float  # drafter confidence in hard stretches ~ U[0, this]
    minimum: float  # clip of the final acceptance
    maximum: float


@dataclass(frozen=True)
class Prefill:
    tokens_per_s: float  # prompt processing speed at empty context
    ctx_half: float  # context at which prompt processing is half as fast
    mtp_penalty: float  # relative slowdown of prompt processing with the MTP head loaded


@dataclass(frozen=True)
class PromptCache:
    """What a slot's saved state weighs in llama-server's host-memory prompt cache (--cache-ram):
    its KV cache per token, plus the fixed recurrent state of a hybrid model; and how fast a saved
    state is copied back to the GPU."""

    bytes_per_token: float = 0.0  # 0: no estimate, the host cache is off for this preset
    state_bytes: float = 0.0
    restore_gb_s: float = 12.0  # host -> device copy (PCIe 4.0 x16 in practice)


@dataclass(frozen=True)
class ChatTemplate:
    """What the model's chat template refuses (simulator/template.py)."""

    refuse_late_system: bool = False  # Qwen3.5/3.6: a system message that is not first -> 500


@dataclass(frozen=True)
class Output:
    prose_min: int  # natural (EOS) length range of an answer, tokens
    prose_max: int
    code_min: int
    code_max: int


@dataclass(frozen=True)
class ModelInfo:
    name: str  # model id served when neither -m nor --alias is given
    n_ctx: int  # default -c
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size: int


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: ModelInfo
    decode: DecodeCost
    spec: SpecCost
    acceptance: Acceptance
    prefill: Prefill
    output: Output
    prompt_cache: PromptCache = PromptCache()
    chat_template: ChatTemplate = ChatTemplate()


def _section(cls: type[T], data: dict[str, Any], key: str, *, optional: bool = False) -> T:
    raw = data.get(key)
    if raw is None and optional:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"preset: missing table [{key}]")
    known = fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in known}
    required = {f.name for f in known if f.default is MISSING}
    unknown = set(raw) - names
    missing = required - set(raw)
    if unknown or missing:
        raise ValueError(f"preset [{key}]: unknown {sorted(unknown)}, missing {sorted(missing)}")
    return cls(**raw)


def parse_preset(data: dict[str, Any]) -> Preset:
    return Preset(
        name=str(data["name"]),
        description=str(data.get("description", "")),
        model=_section(ModelInfo, data, "model"),
        decode=_section(DecodeCost, data, "decode"),
        spec=_section(SpecCost, data, "spec"),
        acceptance=_section(Acceptance, data, "acceptance"),
        prefill=_section(Prefill, data, "prefill"),
        output=_section(Output, data, "output"),
        prompt_cache=_section(PromptCache, data, "prompt_cache", optional=True),
        chat_template=_section(ChatTemplate, data, "chat_template", optional=True),
    )


def load_preset(name: str) -> Preset:
    """Load a bundled preset by name, or any TOML file by path."""
    if name.endswith(".toml"):
        text = Path(name).read_text(encoding="utf-8")
    else:
        ref = resources.files("simulator").joinpath("presets", f"{name}.toml")
        if not ref.is_file():
            raise ValueError(f"unknown preset {name!r}; bundled: {', '.join(bundled_presets())}")
        text = ref.read_text(encoding="utf-8")
    return parse_preset(tomllib.loads(text))


def bundled_presets() -> list[str]:
    folder = resources.files("simulator").joinpath("presets")
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )

"""The performance model of speculative (MTP) decoding: pure functions, no I/O, no clock.

Formulas and their calibration are described in simulator/MODEL.md. In short, one verification
step of a request:

1. draws a stretch regime: "easy" with probability pi, else "hard" (per-token acceptance
   `easy` / `hard` from the preset; pi makes the mean equal the request's acceptance a);
2. drafts: the first n_min positions unconditionally; past them the drafter goes on only while
   the confidence of the token it stands on is >= p_min (position 0 stands on the token the
   target just produced);
3. verifies: drafted tokens are accepted in order until the first rejection, plus the target's
   own token, so a step yields 1 + accepted tokens (E = (1 - a^(k+1)) / (1 - a) per regime);
4. costs base(ctx) * [b(s) + mean x * o(s) + mixed passes] simulated ms, x = sigma + k * (delta
   + nu * ctx / 1000) per drafting request, averaged over the requests decoding in that step.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist
from typing import NamedTuple

from simulator.presets import Preset

_NORMAL = NormalDist()


class Kind(StrEnum):
    """Content kind, the simulator's own ground truth (never exposed to the proxy)."""

    CODE = "code"
    PROSE = "prose"


@dataclass(frozen=True)
class DraftSettings:
    """A server process's speculative settings (llama-server's --spec-* flags), or one request's."""

    spec_type: str = "none"
    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75

    @property
    def enabled(self) -> bool:
        return self.spec_type not in ("", "none") and self.n_max > 0

    @property
    def forced(self) -> int:
        """Positions drafted without the confidence check."""
        return max(0, min(self.n_min, self.n_max))


OFF = DraftSettings()


@dataclass(frozen=True)
class Drafter:
    """Per-step drafting/acceptance law for one acceptance level (see module docstring)."""

    pi_easy: float
    accept_easy: float
    accept_hard: float
    gate_easy: float  # P(confidence >= p_min) in an easy stretch
    gate_hard: float
    gate_first: float  # P(drafting starts at all) when n_min == 0


@dataclass(frozen=True)
class StepExpectation:
    drafted: float  # E[k], drafted tokens per step
    accepted: float  # E[accepted drafted tokens] per step

    @property
    def tokens(self) -> float:
        return 1.0 + self.accepted

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted > 0 else 0.0


@dataclass(frozen=True)
class Prediction:
    prefill_s: float
    decode_tok_s: float
    acceptance: float  # accepted / drafted (0.0 when nothing is drafted)
    total_s: float
    drafted_per_step: float
    tokens_per_step: float


def _clip(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def latent_factor(seed: int, key: str, sigma: float) -> float:
    """Per-session acceptance multiplier, lognormal with median 1, deterministic in (seed, key)."""
    if sigma <= 0:
        return 1.0
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2.0**64
    z = _clip(_NORMAL.inv_cdf(u), -2.5, 2.5)
    return math.exp(sigma * z)


def acceptance(preset: Preset, context_tokens: float, kind: Kind, latent: float = 1.0) -> float:
    """Mean first-position acceptance: falls from the kind's level towards a floor with context."""
    acc = preset.acceptance
    base = acc.code if kind is Kind.CODE else acc.prose
    level = acc.floor + (base - acc.floor) / (1.0 + max(0.0, context_tokens) / acc.ctx_half)
    return _clip(level * latent, acc.minimum, acc.maximum)


def easy_acceptance(preset: Preset, kind: Kind) -> float:
    """Acceptance of a token in an easy stretch: the preset's ``easy``, or for prose its
    ``easy_prose`` when set (a drafter whose confident prose drafts are often wrong, so deeper
    drafts lose on prose while they gain on code: MODEL.md, "Content divergence")."""
    acc = preset.acceptance
    return acc.easy_prose if kind is Kind.PROSE and acc.easy_prose > 0 else acc.easy


def drafter(preset: Preset, a: float, draft: DraftSettings, kind: Kind = Kind.CODE) -> Drafter:
    acc = preset.acceptance
    top = easy_acceptance(preset, kind)
    if a >= top:
        pi, easy, hard = 1.0, a, acc.hard
    elif a <= acc.hard:
        pi, easy, hard = 0.0, top, a
    else:
        pi, easy, hard = (a - acc.hard) / (top - acc.hard), top, acc.hard
    g_easy = _clip((1.0 - draft.p_min) / (1.0 - acc.confidence_easy_min), 0.0, 1.0)
    g_hard = _clip((acc.confidence_hard_max - draft.p_min) / acc.confidence_hard_max, 0.0, 1.0)
    return Drafter(pi, easy, hard, g_easy, g_hard, pi * g_easy + (1.0 - pi) * g_hard)


def expected_step(law: Drafter, draft: DraftSettings) -> StepExpectation:
    """Exact expectation of drafted and accepted tokens per verification step."""
    if not draft.enabled:
        return StepExpectation(0.0, 0.0)
    drafted = accepted = 0.0
    for weight, p_accept, gate in (
        (law.pi_easy, law.accept_easy, law.gate_easy),
        (1.0 - law.pi_easy, law.accept_hard, law.gate_hard),
    ):
        if weight <= 0:
            continue
        reach = 1.0
        for i in range(draft.n_max):
            if i >= draft.forced:
                reach *= law.gate_first if i == 0 else gate
            drafted += weight * reach
            accepted += weight * reach * p_accept ** (i + 1)
    return StepExpectation(drafted, accepted)


def sample_step(rng: random.Random, law: Drafter, draft: DraftSettings) -> tuple[int, int]:
    """One random verification step: (drafted, accepted drafted tokens)."""
    if not draft.enabled:
        return 0, 0
    easy = rng.random() < law.pi_easy
    gate = law.gate_easy if easy else law.gate_hard
    p_accept = law.accept_easy if easy else law.accept_hard
    drafted = 0
    for i in range(draft.n_max):
        if i >= draft.forced and rng.random() >= (law.gate_first if i == 0 else gate):
            break
        drafted += 1
    accepted = 0
    while accepted < drafted and rng.random() < p_accept:
        accepted += 1
    return drafted, accepted


def base_step_ms(preset: Preset, process: DraftSettings, context_tokens: float) -> float:
    """A plain (non-speculative) decode step of one sequence at this context.

    The spill depends on the process's start-up depth (its compute buffers are sized then), not
    on what one request drafts.
    """
    ms = preset.decode.t0_ms * (1.0 + max(0.0, context_tokens) / preset.decode.ctx_half)
    spill = preset.spec.spill_n_max
    if process.enabled and spill > 0 and process.n_max >= spill:
        ms *= preset.spec.spill_slowdown
    return ms


class Neighbours(NamedTuple):
    """What else decodes on the server during one request's step (a tuple: made every step)."""

    others: int  # other decoding requests
    overhead: float  # the sum of their speculative_overhead()
    extra_depths: int  # distinct draft depths among all decoding requests, minus one


def speculative_overhead(
    preset: Preset, draft: DraftSettings, process: DraftSettings, context: float, drafted: float
) -> float:
    """One request's share of a step beyond the plain decode, in plain steps.

    Drafting and verifying `drafted` tokens; at depth 0 in an MTP process the MTP head's
    catch-up pass and the recurrent snapshot planes (`depth0_cost`); nothing without MTP.
    """
    spec = preset.spec
    if draft.enabled:
        per_draft = spec.draft_cost + spec.verify_cost_per_ktok * max(0.0, context) / 1e3
        return spec.step_overhead + drafted * per_draft
    return spec.depth0_cost if process.enabled else 0.0


def concurrency_factor(preset: Preset, concurrent: int) -> float:
    """o(s): growth of the speculative overhead with s requests decoding (see MODEL.md)."""
    extra = max(0, concurrent - 1)
    split = preset.spec.concurrency_split if extra else 0.0
    return 1.0 + split + preset.spec.concurrency_growth * extra


def step_ms(
    preset: Preset,
    draft: DraftSettings,
    context_tokens: float,
    drafted: float,
    concurrent: int,
    process: DraftSettings | None = None,
    neighbours: Neighbours | None = None,
) -> float:
    """Simulated duration of one verification step with `drafted` draft tokens (may be a mean).

    `draft` is what this request drafts, `process` the server's start-up settings (default: the
    same): a request at depth 2 in a depth-3 process drafts like depth 2. The speculative part
    of the step is the mean over the decoding requests (`neighbours`; default: the others draft
    as this one), and each extra draft depth among them costs `mixed_depth_pass` plain steps
    (hybrid models cannot put different draft lengths in one ubatch).
    """
    process = process or draft
    s = max(1, concurrent)
    own = speculative_overhead(preset, draft, process, context_tokens, drafted)
    cost = 1.0 + preset.decode.batch_growth * (s - 1)
    if neighbours is None:
        mean, extra_depths = own, 0
    else:
        mean = (own + neighbours.overhead) / (neighbours.others + 1)
        extra_depths = neighbours.extra_depths if process.enabled else 0
    cost += mean * concurrency_factor(preset, s) + preset.spec.mixed_depth_pass * extra_depths
    return base_step_ms(preset, process, context_tokens) * cost


def decode_speed(
    preset: Preset,
    draft: DraftSettings,
    context_tokens: float,
    kind: Kind,
    latent: float = 1.0,
    concurrent: int = 1,
    process: DraftSettings | None = None,
    neighbours: Neighbours | None = None,
) -> tuple[float, StepExpectation]:
    """Expected decode tokens/s of one request, and its per-step expectation."""
    a = acceptance(preset, context_tokens, kind, latent)
    exp = expected_step(drafter(preset, a, draft, kind), draft)
    ms = step_ms(preset, draft, context_tokens, exp.drafted, concurrent, process, neighbours)
    return 1e3 * exp.tokens / ms, exp


def prefill_ms(preset: Preset, draft: DraftSettings, prompt_n: int, cache_n: int) -> float:
    """Prompt processing time of the uncached part; slower at long context and with MTP loaded."""
    if prompt_n <= 0:
        return 0.0
    pre = preset.prefill
    mid_context = cache_n + prompt_n / 2.0
    speed = pre.tokens_per_s / (1.0 + mid_context / pre.ctx_half)
    penalty = 1.0 + pre.mtp_penalty if draft.enabled else 1.0
    return 1e3 * prompt_n / speed * penalty


def restore_ms(preset: Preset, tokens: int) -> float:
    """Copying a saved state of ``tokens`` tokens from the host prompt cache back to the GPU."""
    if tokens <= 0:
        return 0.0
    cost = preset.prompt_cache
    return 1e3 * (cost.state_bytes + cost.bytes_per_token * tokens) / (cost.restore_gb_s * 1e9)


def predict(
    preset: Preset,
    draft: DraftSettings,
    context_tokens: int,
    cached_tokens: int,
    kind: Kind,
    latent: float,
    output_tokens: int,
    concurrent: int = 1,
    process: DraftSettings | None = None,
    neighbours: Neighbours | None = None,
) -> Prediction:
    """Expected figures of one request without running it.

    context_tokens is the whole prompt (cached + to process); decode is evaluated at the mean
    context over the answer (prompt + output / 2). `draft` is what the request drafts, `process`
    the server's start-up settings (default: the same; prefill pays for the MTP head loaded).
    """
    cached = max(0, min(cached_tokens, context_tokens - 1))
    prefill_s = prefill_ms(preset, process or draft, context_tokens - cached, cached) / 1e3
    mid = context_tokens + output_tokens / 2.0
    speed, exp = decode_speed(preset, draft, mid, kind, latent, concurrent, process, neighbours)
    return Prediction(
        prefill_s=prefill_s,
        decode_tok_s=speed,
        acceptance=exp.acceptance,
        total_s=prefill_s + output_tokens / speed,
        drafted_per_step=exp.drafted,
        tokens_per_step=exp.tokens,
    )

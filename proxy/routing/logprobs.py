"""A request that asks for logprobs runs at depth 0 (pure).

llama-server answers ``logprob 0.0`` (probability 1) for every token it accepted from a draft
when speculative decoding is on: its speculative path sets no probabilities for those tokens
(a TODO in tools/server/server-context.cpp; llama.cpp issue #27972, PR #27196, both open at
b11434). The proxy knows the depth of every request; it is the one place that can
make the answer right: the request gets ``"speculative.n_max": 0`` and the route reason
``logprobs``. It teaches nothing: it ran at depth 0 because it asked for logprobs, not because
depth 0 was its class's choice, so it is no sample of the class at depth 0.

``routing.logprobs_at_depth_zero = false`` turns the rule off (once upstream fixes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # depth imports features, which reads the body through this module
    from proxy.routing.depth import DepthDecision

OUTPUT_LOGPROBS = "message.output_text.logprobs"
"""Responses' ``include`` entry that asks for the output's logprobs."""
DETAIL = "logprobs asked: at depth 0, drafted tokens would read 0.0 (llama.cpp #27972)"


def asks_logprobs(body: Mapping[str, Any]) -> bool:
    """Whether the body asks for token probabilities, in any API's words: chat's ``logprobs:
    true`` (and ``top_logprobs``), completions' ``logprobs: N``, ``/completion``'s ``n_probs``
    (which llama-server also takes on its other routes), Responses' ``top_logprobs`` or an
    ``include`` of the output's logprobs. Anthropic's Messages has no such field."""
    if _positive(body.get("logprobs")) or _positive(body.get("n_probs")):
        return True
    if _positive(body.get("top_logprobs")):
        return True
    include = body.get("include")
    return isinstance(include, list) and OUTPUT_LOGPROBS in include


def at_depth_zero(decision: DepthDecision, depths: Mapping[str, int], off: str) -> DepthDecision:
    """``decision`` at depth 0, as the profile of depth 0 (``off``, the off role's name, when
    no profile has it), reason ``logprobs``."""
    profile = next((p for p in sorted(depths) if depths[p] == 0), off)
    return replace(decision, profile=profile, depth=0, reason="logprobs", detail=DETAIL)


def _positive(value: object) -> bool:
    """True, or a number above 0 (a count of alternatives)."""
    if isinstance(value, bool):
        return value
    return isinstance(value, int | float) and value > 0

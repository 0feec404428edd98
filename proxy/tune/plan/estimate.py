"""How long a run takes: measured on this backend by a short warm-up, not taken from priors.

Two requests before the run: a short prompt that decodes 64 tokens (decode speed) and a prompt
of up to 2,048 tokens that decodes 4 (prefill speed), both at depth 0 where the depth is per
request. A request of the plan is then estimated at its prompt tokens / prefill speed + its
output tokens / decode speed, and a backend start at what the first one took. The progress bar
corrects the estimate as the run goes (``proxy.tune.run.progress``): long prompts prefill slower
than the warm-up's, speculation decodes faster.

The speeds are the backend's own figures (its ``timings``), which a simulator reports at the
speed it models: a request's estimate is in that time, and on the wall clock it takes
``clock_scale`` times less (``wall_s``). So the estimate follows the simulator's time scale, and
says what the same run takes at real speed.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from proxy.config.routing import RoutingSettings
from proxy.routing.telemetry import Observation
from proxy.tune.measure.reading import MeasureError
from proxy.tune.plan.workload import CHAT, WorkItem
from proxy.workloads import texts

_DECODE_TOKENS = 64
_PREFILL_TOKENS = 2048
_PREFILL_OUT = 4

Send = Callable[[WorkItem, str], Awaitable[Observation]]
"""Sends one warm-up request (its marker tag given) at depth 0; the router's observation."""


class WarmUpError(RuntimeError):
    """The warm-up requests did not give a speed; the message says what they answered."""


@dataclass(frozen=True)
class Speeds:
    prefill_tok_s: float
    decode_tok_s: float
    start_s: float = 0.0
    """One backend start on the wall clock, as the first took; 0 through a running service."""

    def request_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return prompt_tokens / self.prefill_tok_s + output_tokens / self.decode_tok_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Speeds:
        return cls(
            float(data["prefill_tok_s"]), float(data["decode_tok_s"]), float(data["start_s"])
        )

    def describe(self) -> str:
        text = f"prefill {self.prefill_tok_s:,.0f} tok/s, decode {self.decode_tok_s:,.1f} tok/s"
        if self.start_s:
            text += f", a backend start {self.start_s:.2g}s"
        return text


def warm_up_items(n_ctx: int, chars_per_token: float, model: str) -> list[WorkItem]:
    """The decode request and the prefill request, sized to fit one slot."""
    tokens = max(64, min(_PREFILL_TOKENS, n_ctx // 2 - 64))
    report = texts.prose(random.Random(9), int(tokens * chars_per_token))
    decode = {
        "model": model,
        "messages": [{"role": "user", "content": "Count from one to one hundred, in words."}],
        "max_tokens": _DECODE_TOKENS,
        "ignore_eos": True,
    }
    prefill = {
        "model": model,
        "messages": [{"role": "user", "content": f"{report}\n\nIn one word: the topic?"}],
        "max_tokens": _PREFILL_OUT,
        "ignore_eos": True,
    }
    return [WorkItem("warm-up-decode", CHAT, decode), WorkItem("warm-up-prefill", CHAT, prefill)]


async def warm_up(send: Send, items: list[WorkItem], start_s: float = 0.0) -> Speeds:
    """Send the warm-up requests; the speeds they show (WarmUpError when they fail)."""
    decode_item, prefill_item = items
    try:
        decode = await send(decode_item, "tune warm-up decode")
        prefill = await send(prefill_item, "tune warm-up prefill")
    except (MeasureError, aiohttp.ClientError, TimeoutError) as exc:
        raise WarmUpError(f"the warm-up failed: {exc}") from None
    decode_speed = decode.decode_tok_s
    tokens = prefill.prefill_tokens
    if not decode_speed or not prefill.prefill_s or not tokens:
        raise WarmUpError(
            f"no speed in the warm-up answers (decode {decode_speed}, prefill "
            f"{prefill.prefill_s} s for {tokens} tokens)"
        )
    return Speeds(tokens / prefill.prefill_s, decode_speed, start_s)


def priors(routing: RoutingSettings, start_s: float = 0.0) -> Speeds:
    """The [routing] priors, when the warm-up could not measure."""
    return Speeds(routing.prior_prefill_tok_s, routing.prior_decode_tok_s, start_s)


def wall_s(model_s: float, clock_scale: float) -> float:
    """Wall-clock seconds of backend time (a simulator's clock runs ``clock_scale`` times fast)."""
    return model_s / clock_scale

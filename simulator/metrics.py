"""llama-server's /metrics (names with the `llamacpp:` prefix), written as Prometheus text.

A small writer rather than prometheus_client: the names contain a colon and llama-server emits
bare counters (no _created series); this keeps the output line for line like the real server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_COUNTERS = (
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
_GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


@dataclass
class Metrics:
    """Totals over the life of the process; gauges that depend on slots are passed to render()."""

    prompt_tokens: int = 0
    prompt_cached: int = 0
    prompt_ms: float = 0.0
    predicted: int = 0
    predicted_ms: float = 0.0
    n_decode: int = 0
    busy_slot_steps: int = 0
    n_tokens_max: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafts: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add_request(
        self,
        *,
        prompt_n: int,
        cache_n: int,
        prompt_ms: float,
        predicted: int,
        predicted_ms: float,
        steps: int,
        busy_slot_steps: int,
        draft_n: int,
        accepted: int,
        drafts: int,
        per_pos: list[int],
    ) -> None:
        self.prompt_tokens += prompt_n
        self.prompt_cached += cache_n
        self.prompt_ms += prompt_ms
        self.predicted += predicted
        self.predicted_ms += predicted_ms
        self.n_decode += steps + (1 if prompt_n else 0)
        self.busy_slot_steps += busy_slot_steps
        self.n_tokens_max = max(self.n_tokens_max, prompt_n + cache_n + predicted)
        self.draft_tokens += draft_n
        self.accepted_tokens += accepted
        self.drafts += drafts
        if len(self.accepted_per_pos) < len(per_pos):
            self.accepted_per_pos.extend([0] * (len(per_pos) - len(self.accepted_per_pos)))
        for i, n in enumerate(per_pos):
            self.accepted_per_pos[i] += n

    def render(self, *, processing: int, deferred: int) -> str:
        counters = (
            self.prompt_tokens,
            self.prompt_cached,
            self.prompt_ms / 1e3,
            self.predicted,
            self.predicted_ms / 1e3,
            self.n_decode,
            self.n_tokens_max,
            self.draft_tokens,
            self.accepted_tokens,
            self.drafts,
        )
        gauges = (
            1e3 * self.prompt_tokens / self.prompt_ms if self.prompt_ms else 0.0,
            1e3 * self.predicted / self.predicted_ms if self.predicted_ms else 0.0,
            processing,
            deferred,
            self.busy_slot_steps / max(1, self.n_decode),
        )
        lines: list[str] = []
        for kind, items, values in (("counter", _COUNTERS, counters), ("gauge", _GAUGES, gauges)):
            for (name, text), value in zip(items, values, strict=True):
                lines += [
                    f"# HELP llamacpp:{name} {text}",
                    f"# TYPE llamacpp:{name} {kind}",
                    f"llamacpp:{name} {_number(value)}",
                ]
        if self.accepted_per_pos:
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(self.accepted_per_pos)]
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))

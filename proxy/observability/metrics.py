"""Prometheus metrics of the proxy, registered on a registry the app is given (never the global).

Labels stay bounded: model names and profiles come from the config, APIs and reasons from fixed
sets, request classes from the configured buckets; no session ids or free text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram

from proxy.routing.choice import Reason
from proxy.routing.plausibility import IMPLAUSIBLE
from proxy.routing.telemetry import Observation

# Label value of a request that never reached the routing step (refused before it, or unknown).
UNROUTED = "none"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
_SPEED_BUCKETS = (5, 10, 20, 30, 40, 50, 60, 80, 100, 150, 200, 400, 1000, 4000)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_TOKEN_BUCKETS = (256, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


class ProxyMetrics:
    """Every metric the request path records. Backend, queue and learned-table series are
    collected at scrape time by `proxy.observability.collectors`, from the objects that own them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "mtp_proxy_"
        self.requests = Counter(
            p + "requests",
            "Requests answered, by model, API, profile, request class and HTTP status.",
            ["model", "api", "profile", "request_class", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            p + "request_duration_seconds",
            "End-to-end request latency as the client sees it.",
            ["model", "api", "profile"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time from request arrival to the first streamed chunk.",
            ["model", "api", "profile"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            p + "proxy_overhead_seconds",
            "Time the proxy spends before the request leaves for the backend.",
            ["api"],
            buckets=_OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Counter(
            p + "output_tokens",
            "Tokens generated, by model and profile.",
            ["model", "profile"],
            registry=registry,
        )
        self.decode_speed = Histogram(
            p + "decode_tokens_per_second",
            "Decode speed per request, by model, profile, request class and load level (the "
            "requests decoding together it was routed at: 1, 2 for 2-3, 4 for 4+; any on a "
            "pool): a speed is compared with another of its own load only.",
            ["model", "profile", "request_class", "load_level"],
            buckets=_SPEED_BUCKETS,
            registry=registry,
        )
        self.acceptance = Histogram(
            p + "draft_acceptance_ratio",
            "Draft acceptance per speculative request, by model, profile and request class.",
            ["model", "profile", "request_class"],
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )
        self.draft_tokens = Counter(
            p + "draft_tokens",
            "Tokens the backends drafted with their speculative type (MTP heads, a draft model, "
            "n-gram lookups: mtp_proxy_backend_speculation_info says which).",
            ["model", "profile", "request_class"],
            registry=registry,
        )
        self.accepted_tokens = Counter(
            p + "draft_accepted_tokens",
            "Drafted tokens the model accepted.",
            ["model", "profile", "request_class"],
            registry=registry,
        )
        self.context_tokens = Histogram(
            p + "context_tokens",
            "Prompt (context) tokens per request as the backend counted them.",
            ["model", "profile"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.cached_ratio = Histogram(
            p + "cached_prompt_ratio",
            "Share of the prompt served from the backend's prefix cache.",
            ["model", "profile"],
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            p + "routing_decisions",
            "Routing decisions by reason and chosen profile.",
            ["model", "reason", "profile"],
            registry=registry,
        )
        self.retries = Counter(
            p + "upstream_retries",
            "Requests sent again before their first byte reached the client: to another backend, "
            "or to a model's one process once it still serves after the failure.",
            ["model"],
            registry=registry,
        )
        self.upstream_failures = Counter(
            p + "upstream_failures",
            "Streams that failed after their first byte (ended with an error event).",
            ["model", "profile"],
            registry=registry,
        )
        self.observations_dropped = Counter(
            p + "observations_dropped",
            "Answers whose numbers could not be true (a negative count or duration, NaN or "
            "infinity, a token count past 2^31, a speed past routing.max_decode_tok_s or "
            "max_prefill_tok_s, more drafts than the depth allows): nothing learned from them. "
            "reason: negative, non_finite, too_large, too_fast, drafts.",
            ["model", "reason"],
            registry=registry,
        )
        self.state_save_failures = Counter(
            p + "state_save_failures",
            "Saves of the learned statistics to routing.learned_file that failed (the disk full, "
            "the directory gone or read-only): what was learned since is lost at a restart.",
            registry=registry,
        )

    def prime(self, profiles: Mapping[str, Sequence[str]]) -> None:
        """Create the series of every configured model and profile at 0, so that `rate()` and
        `increase()` see their first increment and dashboards list every routing reason."""
        for model, names in profiles.items():
            self.retries.labels(model)
            for profile in names:
                self.output_tokens.labels(model, profile)
                self.upstream_failures.labels(model, profile)
                for reason in get_args(Reason):
                    self.decisions.labels(model, reason, profile)
            for dropped in IMPLAUSIBLE:
                self.observations_dropped.labels(model, dropped)

    def count_request(
        self, model: str, api: str, profile: str, request_class: str, status: int
    ) -> None:
        self.requests.labels(model, api, profile, request_class, str(status)).inc()

    def record_unrouted(
        self, api: str, status: int, elapsed_s: float, model: str = UNROUTED
    ) -> None:
        """A request answered without routing, an error before it (bad body, unknown model, no
        key) or a forwarded route (/tokenize ...): counted and timed like every other, under
        profile and class "none"."""
        self.count_request(model, api, UNROUTED, UNROUTED, status)
        self.latency.labels(model, api, UNROUTED).observe(elapsed_s)

    def record_observation(
        self, model: str, profile: str, observation: Observation, load_level: str
    ) -> None:
        """Token, speed and acceptance series of one served request, routed at ``load_level``."""
        label = observation.request_class.label
        if observation.output_tokens:
            self.output_tokens.labels(model, profile).inc(observation.output_tokens)
        if observation.decode_tok_s:
            speed = self.decode_speed.labels(model, profile, label, load_level)
            speed.observe(observation.decode_tok_s)
        drafted, accepted = observation.draft_n, observation.draft_n_accepted
        if drafted and accepted is not None:
            self.draft_tokens.labels(model, profile, label).inc(drafted)
            self.accepted_tokens.labels(model, profile, label).inc(accepted)
            self.acceptance.labels(model, profile, label).observe(accepted / drafted)
        context = observation.context_tokens
        if context:
            self.context_tokens.labels(model, profile).observe(context)
            cached = observation.cached_tokens or 0
            self.cached_ratio.labels(model, profile).observe(cached / context)

"""Settings of the routing policy, learned statistics and request features.

A plain pydantic model: the proxy's pydantic-settings tree embeds it (e.g. under ``[routing]``),
so the same validation applies to TOML, environment variables and tests.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["off", "min", "max"]
"""The three roles the cold-start rules speak of; each maps to a configured profile name."""


class RoutingSettings(BaseModel):
    """Thresholds and priors of the routing policy. Every figure has a documented default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- request classes -------------------------------------------------------------------
    context_buckets: list[int] = Field(
        default=[4096, 16384, 32768, 65536],
        description="Upper bounds (tokens) of the context-length buckets; a request class is "
        "bucket x content kind. [4096, 16384] gives '<4k', '4k-16k', '16k+'.",
    )

    # --- cold-start rules --------------------------------------------------------------------
    long_context_tokens: int = Field(
        default=32768,
        gt=0,
        description="From this many (planned) prompt tokens on, the cold rules treat a request "
        "as long context: code -> cold_long_code_role, prose -> cold_long_prose_role.",
    )
    cold_short_role: Role = Field(
        default="max",
        description="Cold pick below the threshold. max is the best short-request profile "
        "where speculation is cheap (Setup B); where n_max 3 spills VRAM (Setup A) learning "
        "moves short traffic to min within a few requests. Short requests on max and long "
        "code on min also keep chats from overwriting agents' prompt caches, which the "
        "routing benchmark shows to matter more than the first few placements.",
    )
    cold_long_code_role: Role = Field(default="min", description="Cold pick, long-context code.")
    cold_long_prose_role: Role = Field(default="off", description="Cold pick, long prose.")
    agent_horizon_tokens: int = Field(
        default=32768,
        ge=0,
        description="A new agent-like session (tools, tool results, agent system prompt) is "
        "placed as if its prompt were at least this long: the session stays where it starts "
        "(prefix cache), so it is placed for what it will become. 0 disables.",
    )
    resident_session_tokens: int = Field(
        default=8192,
        ge=0,
        description="A session whose cached prompt on a backend is at least this long (an "
        "agent's, a document's) counts as standing load there: it comes back turn after turn "
        "and stays for its cache. A new agent session is placed with that load counted, and "
        "the cold rules spread such sessions over the long-code profiles (min, off) instead of "
        "stacking them on one. 0 disables.",
    )
    break_even_acceptance: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="A speculative profile whose learned acceptance in a class is below this "
        "is skipped by the cold rules and not explored on long contexts.",
    )

    # --- learned statistics ----------------------------------------------------------------
    min_samples: int = Field(
        default=5,
        ge=1,
        description="Observations of a (class, profile) before its estimate is trusted.",
    )
    half_life_samples: float = Field(
        default=50.0,
        gt=1.0,
        description="Exponential decay of the statistics, counted in observations of the same "
        "(class, profile): an observation this many updates old weighs half.",
    )

    # --- exploration (bandit) -------------------------------------------------------------
    exploration_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=0.2,
        description="At most this fraction of requests explores another profile (hard cap "
        "0.2). Thompson sampling decides whether a given draw actually explores.",
    )
    cold_exploration_rate: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="While a class has fewer than two trusted profiles (its placements come "
        "from the cold rules), this share of its requests below exploration_max_tokens tries a "
        "profile with too few samples instead, so the class learns in a few requests rather "
        "than in hundreds (a cold rule can be far off: setup A's max is the slowest profile). "
        "Bounded by count, not rate: it stops once two profiles have min_samples each.",
    )
    exploration_max_regret: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="On long contexts, only profiles whose expected goodput is within this "
        "fraction of the best are explored (a wrong pick there costs a lot).",
    )
    exploration_max_tokens: int = Field(
        default=32768,
        ge=0,
        description="No exploration at all for (planned) prompts of this many tokens or more: "
        "a long prompt, or a new agent session planned at agent_horizon_tokens, stays on its "
        "backend for its prefix cache, so a wrong exploratory pick is paid on every later turn.",
    )

    # --- load ------------------------------------------------------------------------------
    spill_threshold: float = Field(
        default=1.0,
        gt=0.0,
        description="A backend with in_flight >= spill_threshold x slots is busy: the policy "
        "compares queueing there with moving to another profile (reason 'spill').",
    )
    batch_slowdown: float = Field(
        default=0.1,
        ge=0.0,
        description="Per-request decode speed falls by this fraction per other request in "
        "flight on the same backend (prior; continuous batching shares the GPU).",
    )
    spec_load_penalty: float = Field(
        default=0.12,
        ge=0.0,
        description="Extra slowdown per request in flight for speculative profiles: the "
        "verification batch grows and the speculation gain shrinks or turns into a loss. "
        "0.12 fits the measured shape (a 1.71x gain alone, ~1.24x with 4 in flight, ~1x "
        "with 8); 0.25 overstated it and sent requests to idle but slower profiles.",
    )

    # --- one process, profiles as per-request depths ------------------------------------------
    concurrency_levels: list[int] = Field(
        default=[1, 2, 4],
        description="Load levels of the per-request statistics, in requests decoding on the "
        "process with this one: [1, 2, 4] keeps 1 (alone), 2-3 and 4+ apart. Published llama.cpp "
        "runs: MTP +60-99% alone, -19% to -30% at 2-4 parallel requests.",
    )
    cold_busy_role: Role = Field(
        default="off",
        description="Cold pick of a depth when the request will decode beside others (level "
        "2+): the published runs lose with speculation there. What the process measures at "
        "each depth while busy takes over (proxy/routing/busy.py): this depth first, then the "
        "deepest (or, when this is the deepest, the shallowest).",
    )
    busy_epoch_admissions: int = Field(
        default=8,
        ge=1,
        description="While a process is busy, every request beside others runs at one depth "
        "for this many admissions (an epoch); the next epoch's depth is chosen from what the "
        "process achieved at each depth while busy (proxy/routing/busy.py).",
    )
    load_half_life_requests: float = Field(
        default=8.0,
        gt=0.0,
        description="A process's recent concurrency (decayed mean of the requests decoding at "
        "each admission) has this half-life in admissions: the depth of the first request of a "
        "burst is chosen for the load the burst is likely to reach, since later ones join it.",
    )

    # --- prefix-cache affinity ---------------------------------------------------------------
    session_idle_ttl_s: float = Field(
        default=1800.0,
        gt=0.0,
        description="A session -> backend binding is forgotten after this idle time (the app "
        "keeps the map; llama-server evicts old slot caches anyway).",
    )
    max_sessions: int = Field(
        default=10_000,
        ge=1,
        description="Session -> backend bindings kept at most (each under ~0.5 kB: keys are "
        "capped at 256 characters); past it the least recently used goes first, so a client "
        "inventing session ids cannot grow the proxy's memory.",
    )
    eviction_weight: float = Field(
        default=0.5,
        ge=0.0,
        description="A new session placed on a backend whose slots all hold caches overwrites "
        "the least recently used one; this share of that prompt's re-processing time is "
        "counted against the placement (its session may or may not come back). 0 ignores it.",
    )
    affinity_horizon_requests: float = Field(
        default=3.0,
        ge=0.0,
        description="A session leaves the backend holding its cache only if the expected "
        "per-request gain, counted over this many requests, exceeds the re-prefill cost.",
    )

    # --- priors used before anything is learned ------------------------------------------------
    chars_per_token: float = Field(default=3.5, gt=0.5, lt=20.0)
    chars_per_token_half_life: float = Field(default=20.0, gt=1.0)
    prior_decode_tok_s: float = Field(default=30.0, gt=0.0)
    prior_prefill_tok_s: float = Field(default=1000.0, gt=0.0)
    prior_output_tokens: int = Field(default=400, gt=0)

    # --- learning switch, randomness, clock ------------------------------------------------
    learning: bool = Field(
        default=True,
        description="False: cold-start rules only. Nothing is learned (statistics and the "
        "chars-per-token calibration stay as loaded) and nothing is explored; a safe mode, and "
        "the 'rules' baseline of the routing benchmark.",
    )
    seed: int | None = Field(
        default=None,
        description="Seed of the exploration draws (None: fresh randomness per start). "
        "Benchmarks set it so that runs repeat.",
    )
    clock_scale: float = Field(
        default=1.0,
        gt=0.0,
        description="Backend seconds per second of the proxy's clock, applied to the durations "
        "the proxy measures itself (answers without timings: Anthropic Messages, non-stream "
        "Responses). 1 with real backends; against simulators run with --time-scale F set F, "
        "so clock-measured speeds are in the same seconds as the backends' own timings.",
    )

    # --- persistence ---------------------------------------------------------------------
    state_file: Path | None = Field(
        default=None, description="Learned statistics survive restarts in this JSON file."
    )
    state_save_interval_s: float = Field(default=30.0, gt=0.0)

    # --- headers and profile roles ---------------------------------------------------------
    session_header: str = "X-MTP-Session"
    pin_header: str = "X-MTP-Profile"
    profile_off: str = "off"
    profile_min: str = "min"
    profile_max: str = "max"

    @model_validator(mode="after")
    def _check(self) -> Self:
        buckets = self.context_buckets
        if not buckets or any(b <= 0 for b in buckets):
            raise ValueError("context_buckets must be a non-empty list of positive integers")
        if any(b >= c for b, c in itertools.pairwise(buckets)):
            raise ValueError("context_buckets must be strictly increasing")
        levels = self.concurrency_levels
        if not levels or levels[0] != 1 or any(a >= b for a, b in itertools.pairwise(levels)):
            raise ValueError("concurrency_levels must start at 1 and be strictly increasing")
        names = (self.profile_off, self.profile_min, self.profile_max)
        if len(set(names)) != len(names) or not all(names):
            raise ValueError("profile_off, profile_min and profile_max must be distinct names")
        return self

    def role_profile(self, role: Role) -> str:
        """The configured profile name that plays ``role``."""
        return self._roles()[role]

    def resolve_pin(self, pin: str) -> str:
        """Map a pin header value (off|min|max, any case, or a profile name) to a profile."""
        return self._roles().get(pin.lower(), pin)

    def is_speculative(self, profile: str) -> bool:
        """Every profile but the "off" one drafts (custom profiles are assumed to)."""
        return profile != self.profile_off

    def _roles(self) -> dict[str, str]:
        return {"off": self.profile_off, "min": self.profile_min, "max": self.profile_max}


def decay_factor(half_life: float) -> float:
    """Per-update weight multiplier so that an update ``half_life`` updates old weighs 0.5."""
    return math.exp(-math.log(2.0) / half_life)

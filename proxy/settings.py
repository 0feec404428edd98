"""Settings: a TOML file validated by pydantic, with MTP_PROXY_* environment overrides.

The file is loaded explicitly (a missing file is an error, never silent defaults); with no file the
embedded default (`default_config.toml`: the simulated demo pool) is used. Environment variables
override the file, e.g. ``MTP_PROXY_SERVER__PORT=9000``.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.model_names import ModelNameSettings
from proxy.routing.settings import RoutingSettings
from supervisor.commandline import llama_server_argv, resolve_llama_server
from supervisor.settings import SupervisorSettings
from supervisor.spec import BackendSpec, DraftSpec

BackendKind = Literal["simulator", "llama-server"]
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

    def names(self) -> list[str]:
        return [self.name, *self.aliases]

    def slots_of(self, profile: ProfileSettings) -> int:
        """Requests one backend serves at once: `slots`, else its -np/--parallel, else 4."""
        if self.slots is not None:
            return self.slots
        args = [*self.args, *profile.args]
        for flag in ("-np", "--parallel"):
            if flag in args[:-1]:
                value = args[args.index(flag) + 1]
                if value.isdigit() and int(value) > 0:
                    return int(value)
        return _LLAMA_SERVER_DEFAULT_SLOTS


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


def load_settings(path: Path | None) -> Settings:
    """Load `path` (or the embedded default) and validate it; raise ConfigError listing problems."""
    source = str(path) if path else "<embedded default>"
    try:
        if path is None:
            text = resources.files("proxy").joinpath("default_config.toml").read_text("utf-8")
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


def backend_slots(settings: Settings) -> dict[str, int]:
    """Slots of every backend, by backend name (see `ModelSettings.slots_of`)."""
    return {
        spec.name: model.slots_of(profile)
        for model in settings.models
        for profile in model.profiles
        for spec in backend_specs_of(model, profile)
    }


def backend_specs(settings: Settings) -> list[BackendSpec]:
    """Every backend the pool runs: one per replica of each profile of each model."""
    return [
        spec
        for model in settings.models
        for profile in model.profiles
        for spec in backend_specs_of(model, profile)
    ]


def backend_specs_of(model: ModelSettings, profile: ProfileSettings) -> list[BackendSpec]:
    argv = () if profile.url else tuple(_argv(model, profile))
    return [
        BackendSpec(
            name=f"{model.name}/{profile.name}" + (f"#{n + 1}" if profile.replicas > 1 else ""),
            model=model.name,
            profile=profile.name,
            argv=argv,
            env=dict(profile.env),
            url=profile.url,
        )
        for n in range(profile.replicas)
    ]


def _argv(model: ModelSettings, profile: ProfileSettings) -> list[str]:
    simulated = model.backend == "simulator"
    binary = sys.executable if simulated else resolve_llama_server(model.binary)
    argv = llama_server_argv(
        binary,
        model.model_path or model.name,
        [*model.args, "--alias", model.name],
        profile.draft(),
        profile.args,
    )
    if simulated:
        argv[1:1] = ["-m", "simulator"]  # the twin takes llama-server's flags as they are
    return argv

"""What to run: one backend's speculative settings and its full launch description."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.flags import SPEC_TYPES_OFF, supervisor_flag_in
from supervisor.spec_types import DRAFT_MODEL_TYPES, draft_model_types
from supervisor.urls import base_url_problem


@dataclass(frozen=True)
class DraftSpec:
    """Speculative-decoding settings of one profile (one llama-server process)."""

    spec_type: str | None = None  # None/"none" = off; "draft-mtp", "draft-simple", "ngram-mod"...
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    draft_model: str | None = None  # -md: draft-simple, draft-eagle3, draft-dflash, draft-dspark

    def __post_init__(self) -> None:
        # Fail at configuration time with a readable message rather than when
        # llama-server exits with its own error seconds (or minutes) later.
        if self.spec_type is not None and self.spec_type.split() != [self.spec_type]:
            raise ValueError(f"spec_type must be one word, got {self.spec_type!r}")
        if self.is_off:
            set_fields = [
                name
                for name in ("n_max", "n_min", "p_min", "draft_model")
                if getattr(self, name) is not None
            ]
            if set_fields:
                raise ValueError(f"speculation is off but {', '.join(set_fields)} is set")
            return
        if self.n_max is not None and self.n_max < 1:
            raise ValueError(f"n_max must be >= 1, got {self.n_max}")
        if self.n_min is not None and self.n_min < 0:
            raise ValueError(f"n_min must be >= 0, got {self.n_min}")
        if self.n_min is not None and self.n_max is not None and self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"p_min must be within [0, 1], got {self.p_min}")
        with_draft = draft_model_types(self.spec_type)
        if with_draft and not self.draft_model:
            raise ValueError(
                f"spec_type {with_draft[0]} needs draft_model (-md DRAFT.gguf): without one "
                "llama-server serves and never drafts"
            )
        if not with_draft and self.draft_model is not None:
            raise ValueError(
                f"draft_model is only used by {', '.join(DRAFT_MODEL_TYPES)}, not {self.spec_type}"
            )

    @property
    def is_off(self) -> bool:
        return self.spec_type is None or self.spec_type in SPEC_TYPES_OFF


@dataclass(frozen=True)
class BackendSpec:
    """One backend the supervisor keeps alive (or, with ``url``, only watches)."""

    name: str  # unique, e.g. "mtp-demo/max" or "mtp-demo/max#2" for replicas
    model: str  # model name the proxy serves it under
    profile: str  # profile name ("off", "min", "max", ...)
    argv: tuple[str, ...]  # full command WITHOUT --host/--port; empty if remote
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the child
    url: str | None = None  # remote backend base URL (no process control)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("backend name must not be empty")
        if self.url is None and not self.argv:
            raise ValueError(f"backend {self.name!r}: needs argv (local) or url (remote)")
        if self.url is not None and self.argv:
            raise ValueError(f"backend {self.name!r}: set argv or url, not both")
        if self.url is not None and (problem := base_url_problem(self.url)) is not None:
            raise ValueError(f"backend {self.name!r}: {problem}")
        if (arg := supervisor_flag_in(self.argv[1:])) is not None:
            raise ValueError(f"backend {self.name!r}: {arg} is set by the supervisor")

    @property
    def is_remote(self) -> bool:
        return self.url is not None

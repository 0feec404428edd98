"""The `[model_names]` section: which configured model answers a name that clients send.

The resolution itself (a model's name or alias, then the patterns in order, then the default) is
`proxy.serving.model_names.ModelCatalog`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelNameSettings(BaseModel):
    """Names clients send, mapped to the configured model that serves them."""

    model_config = ConfigDict(extra="forbid")

    default: str | None = Field(
        default=None,
        min_length=1,
        description="The model that answers a name nothing else matches, and a request that names "
        "no model. Unset: such a name is a 404 in the called API's error shape (a request naming "
        "no model still goes to the only model, if there is one).",
    )
    patterns: dict[str, str] = Field(
        default={},
        description="Glob patterns -> model, tried in the order written after the models' own "
        "names and aliases. fnmatch patterns (*, ?, [abc]), case-sensitive; for example { "
        '"claude-*" = "mtp-demo" } sends Claude Code\'s names to mtp-demo.',
    )

    def targets(self) -> list[str]:
        """Every model these settings point at (validated against the configured models)."""
        named = [self.default] if self.default is not None else []
        return named + list(self.patterns.values())

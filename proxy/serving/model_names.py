"""Model names as clients send them -> the configured model that serves them.

Agents send names the proxy cannot know in advance: Claude Code asks for `claude-...` models
(and a second, small one for background work), Codex for `gpt-...`. A single llama-server
answers any name; the proxy does the same when told to, through `[model_names]`:

    [model_names]
    default = "mtp-demo"                  # any other name (or none) -> this model
    patterns = { "claude-*" = "mtp-demo" } # glob patterns, tried in order after exact names

Resolution order: a model's name or alias, then the first matching pattern, then the default.
Without a default, a name nothing matches is a 404 in the called API's error shape.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Protocol

from proxy.config.model_names import ModelNameSettings


class NamedModel(Protocol):
    @property
    def name(self) -> str: ...

    def names(self) -> list[str]: ...


def unknown_model_message(requested: object) -> str:
    """The refusal of a model name no configured model answers to. Only a string is shown (cut
    short): the repr of a list nested ~1000 deep, still valid JSON, exceeds the recursion
    limit, which made this refusal a 500."""
    shown = (
        repr(requested[:100])
        if isinstance(requested, str)
        else f"of type {type(requested).__name__}"
    )
    return f"model {shown} does not exist"


class ModelCatalog:
    """Model names and aliases as clients send them, mapped to the configured model."""

    def __init__(
        self, models: Sequence[NamedModel], names: ModelNameSettings | None = None
    ) -> None:
        names = names or ModelNameSettings()
        self._primary = [m.name for m in models]
        self._by_name = {name: m.name for m in models for name in m.names()}
        self._patterns = list(names.patterns.items())
        only = self._primary[0] if len(self._primary) == 1 else None
        self._default = names.default
        # A request that names no model goes to the only model, as llama-server does.
        self._unnamed = names.default or only

    def resolve(self, requested: object) -> str | None:
        if requested is None:
            return self._unnamed
        if not isinstance(requested, str):
            return None
        exact = self._by_name.get(requested)
        if exact is not None:
            return exact
        for pattern, model in self._patterns:
            if fnmatch.fnmatchcase(requested, pattern):
                return model
        return self._default

    def primary_names(self) -> list[str]:
        return list(self._primary)

    def all_names(self) -> list[str]:
        return list(self._by_name)

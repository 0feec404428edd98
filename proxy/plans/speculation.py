"""What a backend drafts with: its speculative type and its draft model, read from the arguments
it runs with as llama-server reads them (the last ``--spec-type`` or ``-md`` wins, the model's
arguments first, then the profile's draft settings, then the profile's own arguments).

The one reading behind check-config's draft-model checks and what /admin/backends, `mtp-proxy
status`, the live page and the metric ``mtp_proxy_backend_speculation_info`` show per backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

from proxy.config.settings import ModelSettings, ProfileSettings, Settings
from proxy.plans.plan import ModelPlan, processes
from supervisor.commandline import speculative_args
from supervisor.flags import DRAFT_MODEL, SPEC_TYPE, SPEC_TYPES_OFF, flag_value

NONE = "none"
SPECULATION_KEYS = ("spec_type", "draft_model")  # what as_json writes


@dataclass(frozen=True)
class Speculation:
    """A process's speculative type ("none" when it does not draft) and draft model path."""

    spec_type: str = NONE
    draft_model: str | None = None

    @property
    def drafts(self) -> bool:
        return self.spec_type != NONE

    @property
    def draft_file(self) -> str | None:
        """The draft model's file name (its folder is the operator's business, not a label's)."""
        return None if self.draft_model is None else PurePath(self.draft_model).name

    def words(self) -> str:
        """One phrase: ``ngram-mod``, ``draft-simple (draft.gguf)``, ``none``."""
        return self.spec_type + (f" ({self.draft_file})" if self.draft_file else "")

    def as_json(self) -> dict[str, str | None]:
        return {"spec_type": self.spec_type, "draft_model": self.draft_file}


def speculation_of(model: ModelSettings, profile: ProfileSettings) -> Speculation:
    """What a process of ``profile`` drafts with."""
    args = [*model.args, *speculative_args(profile.draft()), *profile.args]
    spec_type = flag_value(args, SPEC_TYPE)
    if spec_type is None or spec_type in SPEC_TYPES_OFF:
        return Speculation()
    return Speculation(spec_type, flag_value(args, DRAFT_MODEL))


def backend_speculation(
    settings: Settings, plans: Mapping[str, ModelPlan]
) -> dict[str, Speculation]:
    """Every backend's speculation under the plans in force, by backend name."""
    return {
        process.name: speculation_of(model, process.profile)
        for model in settings.models
        if (plan := plans.get(model.name)) is not None
        for process in processes(model, plan)
    }

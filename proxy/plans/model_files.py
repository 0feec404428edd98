"""The model files a configuration names, checked before anything starts (`check-config`):
each must exist, be readable and be a whole GGUF (`serve` checks that much too), a GGUF whose
profiles draft with draft-mtp must carry MTP layers, and a profile whose speculative type drafts
with a draft model must name one of the kind that type needs (proxy.plans.draft_models: an
EAGLE3 or DFlash draft, or for draft-simple one of the model's vocabulary). Without these checks
a wrong path or a stripped quant passed as "OK" and then failed in llama-server, six times,
behind a proxy answering 503, and a wrong draft model served without ever drafting.
"""

from __future__ import annotations

from pathlib import Path

from proxy.config.settings import ModelSettings, ProfileSettings, Settings
from proxy.plans.draft_models import draft_kind_problem, vocabulary_differences
from proxy.plans.gguf import GgufError, read_gguf
from proxy.plans.speculation import speculation_of
from supervisor.spec_types import MTP, draft_model_types, known, type_names

MTP_SPEC_TYPE = MTP


MTP_DOWNLOAD_ADVICE = (
    "Download a GGUF that keeps them: many quantized uploads strip the MTP (NextN) layers; pick "
    "one whose model card says they are kept, for example a Qwen3.5/Qwen3.6 quant (architecture "
    "qwen35 or qwen35moe, tensors blk.N.nextn.*), or convert the original weights with "
    "llama.cpp's convert_hf_to_gguf.py, which keeps them"
)


def no_mtp_advice(architecture: str) -> str:
    """What to download instead of a GGUF without MTP layers (check-config's)."""
    return (
        f"it has no MTP layers ({architecture}.nextn_predict_layers is absent), and MTP "
        f"drafting needs them. {MTP_DOWNLOAD_ADVICE}"
    )


def model_file_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """(problems that make the configuration unusable, warnings), one line each."""
    problems: list[str] = []
    for m, model, spawned in _spawning(settings):
        assert model.model_path is not None
        where = f"models.{m}.model_path ({model.name})"
        unreadable = _unreadable(Path(model.model_path).expanduser())
        if unreadable is not None:
            problems.append(f"{where}: {model.model_path}: {unreadable}")
        else:
            _check_gguf(model, spawned, where, problems)
        for p, profile in enumerate(model.profiles):
            if profile.url is None:
                target = None if unreadable else Path(model.model_path).expanduser()
                problems += _draft_problems(m, p, model, profile, target)
    return problems, []


def _draft_problems(
    m: int, p: int, model: ModelSettings, profile: ProfileSettings, target: Path | None
) -> list[str]:
    """The draft model of a profile against its speculative type(s) and, for draft-simple, the
    model's vocabulary (``target``: the model's GGUF, None when it cannot be read)."""
    where = f"models.{m}.profiles.{p}"
    named = f"({model.name}/{profile.name})"
    speculation = speculation_of(model, profile)
    types = draft_model_types(speculation.spec_type)
    if speculation.draft_model is None:
        if not types:
            return []
        return [
            f"{where} {named}: spec_type {types[0]} drafts with a draft model: set draft_model "
            "(-md DRAFT.gguf); without one llama-server serves and never drafts"
        ]
    draft = Path(speculation.draft_model).expanduser()
    if (why := _unreadable(draft)) is not None:
        return [f"{where}.draft_model {named}: {speculation.draft_model}: {why}"]
    try:
        problems = [
            f"{where}.draft_model {named}: {problem}"
            for name in types
            if (spec := known(name)) is not None
            and (problem := draft_kind_problem(spec, draft)) is not None
        ]
        if "draft-simple" in types and target is not None and not problems:
            problems += _vocabulary_problem(f"{where}.draft_model {named}", target, draft)
    except (GgufError, OSError) as exc:
        return [f"{where}.draft_model {named}: {exc}"]
    return problems


def _vocabulary_problem(where: str, target: Path, draft: Path) -> list[str]:
    differences = vocabulary_differences(target, draft)
    if not differences:
        return []
    return [
        f"{where}: the draft model {draft} does not share the vocabulary of {target} "
        f"(model vs draft: {'; '.join(differences)}), so llama-server would serve without "
        'speculation (its log: "draft model vocab type must match target model"). Use a '
        "draft model of the same family and tokenizer"
    ]


def gguf_problems(settings: Settings) -> list[str]:
    """The model files of spawned backends that are there but are no GGUF, or a truncated
    one (`serve`'s check before anything starts: llama-server would fail on them, six times;
    a missing file is still left to the backends, which a reload may bring)."""
    problems = []
    for m, model, _ in _spawning(settings):
        assert model.model_path is not None
        path = Path(model.model_path).expanduser()
        if path.is_file():
            try:
                read_gguf(path)
            except GgufError as exc:
                problems.append(f"models.{m}.model_path ({model.name}): {exc}")
    return problems


def _spawning(settings: Settings) -> list[tuple[int, ModelSettings, list[ProfileSettings]]]:
    """(index, model, profiles it spawns) of each llama-server model that spawns processes."""
    found = []
    for m, model in enumerate(settings.models):
        spawned = [p for p in model.profiles if p.url is None]
        if model.backend == "llama-server" and model.model_path is not None and spawned:
            found.append((m, model, spawned))
    return found


def needs_mtp(model: ModelSettings, profile: ProfileSettings) -> bool:
    """Whether the profile's process drafts with draft-mtp (its spec_type or its args)."""
    return MTP in type_names(speculation_of(model, profile).spec_type)


def _check_gguf(
    model: ModelSettings, profiles: list[ProfileSettings], where: str, problems: list[str]
) -> None:
    """The file is a GGUF, read whole to its tensor data's end, with the MTP layers that its
    draft-mtp profiles need."""
    assert model.model_path is not None
    try:
        facts = read_gguf(Path(model.model_path).expanduser())
    except GgufError as exc:
        problems.append(f"{where}: {exc}")
        return
    drafting = [p.name for p in profiles if needs_mtp(model, p)]
    if drafting and not facts.has_mtp:
        names = ", ".join(drafting)
        problems.append(
            f"{where}: profiles {names} draft with {MTP_SPEC_TYPE}, but {model.model_path}: "
            f"{no_mtp_advice(facts.architecture)}. Or serve it without drafting: remove "
            f'spec_type = "{MTP_SPEC_TYPE}" from those profiles'
        )


def _unreadable(path: Path) -> str | None:
    """Why this process cannot read the file, or None when it can."""
    try:
        with path.open("rb") as handle:
            handle.read(4)
    except FileNotFoundError:
        return "file not found" + _hidden_home(path)
    except IsADirectoryError:
        return "is a directory, not a GGUF file"
    except PermissionError:
        return "not readable by this user" + _hidden_home(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None


def _hidden_home(path: Path) -> str:
    home = path.is_absolute() and path.parts[1:2] in (("home",), ("root",))
    return " (the service's ProtectHome=yes hides /home and /root)" if home else ""

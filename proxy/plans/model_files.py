"""The model files a configuration names, checked before anything starts (`check-config`):
each must exist, be readable and be a whole GGUF (`serve` checks that much too), and a GGUF
whose profiles draft with draft-mtp must carry MTP layers. Without these checks a wrong path or
a stripped quant passed as "OK" and then failed in llama-server, six times, behind a proxy
answering 503.
"""

from __future__ import annotations

from pathlib import Path

from proxy.config.settings import ModelSettings, ProfileSettings, Settings
from proxy.plans.gguf import GgufError, read_gguf
from supervisor.flags import SPEC_TYPE, flag_value

MTP_SPEC_TYPE = "draft-mtp"


def no_mtp_advice(architecture: str) -> str:
    """What to download instead of a GGUF without MTP layers (check-config's and init's)."""
    return (
        f"it has no MTP layers ({architecture}.nextn_predict_layers is absent), and MTP "
        "drafting needs them. Download a GGUF that keeps them: many quantized uploads strip "
        "the MTP (NextN) layers; pick one whose model card says they are kept, for example a "
        "Qwen3.5/Qwen3.6 quant (architecture qwen35 or qwen35moe, tensors blk.N.nextn.*), or "
        "convert the original weights with llama.cpp's convert_hf_to_gguf.py, which keeps them"
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
            draft = profile.draft_model
            if draft is not None and (why := _unreadable(Path(draft).expanduser())) is not None:
                problems.append(
                    f"models.{m}.profiles.{p}.draft_model ({model.name}/{profile.name}): "
                    f"{draft}: {why}"
                )
    return problems, []


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
    args_spec = flag_value([*model.args, *profile.args], SPEC_TYPE)
    return MTP_SPEC_TYPE in (profile.spec_type, args_spec)


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

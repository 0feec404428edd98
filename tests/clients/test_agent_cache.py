"""A real Claude Code session keeps llama-server's prefix cache through the proxy's mends, on the
real Qwen3.5 template and a hybrid model (the Qwen3.5/3.6 family's shape): bench/agent_cache.py,
asserted.

- Turn after turn (`claude -p`, then `--continue`, with a `git init` in between so that Claude
  Code appends an "# Environment update" system turn, which the template refuses and the proxy
  rewrites in place): each request reuses the previous request's prompt up to a context
  checkpoint. A hybrid model restores only checkpoints, the nearest one `n_ubatch + 4` tokens
  before the previous prompt's end (the Qwen3.5 template re-renders the previous answer's
  `<think>` opening, within its last few tokens). Folding the system turn into the first
  system message instead would cost the whole prompt (~40k tokens) at that turn. Claude Code
  puts its environment in a system turn after the first user message: the proxy's rewrite leaves
  it there, as a user reminder.
- Within a turn, when an answer has no visible text, Claude Code sends the request again with its
  last user message edited (measured: "say hi" becomes "say hi\n" plus a reminder to answer
  visibly). That message comes before the environment turn, so the resend reuses the prompt only
  up to the checkpoint at that message's start: ~8k tokens less than the previous prompt, every
  token of the tools and agent prompt kept. The first turn's request is sent again that way
  whenever the tiny model's sampled answer is empty (seen in CI).
- A second session in the same directory with another first prompt reuses the agent prompt
  ([compat] session_prefix): without it, it prefills everything again.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from bench.agent_cache import Setup, measure_resend, measure_sessions, measure_turns
from tests.clients.test_clients import client
from tests.support.chat_templates import QWEN35, chat_template
from tests.support.llama_fixtures import llama_server_binary
from tests.support.tinygguf import Mtp, Qwen35Config, write_qwen35

pytestmark = pytest.mark.clients

# llama-server's default micro-batch (-ub): it checkpoints a hybrid model's state that many
# tokens plus 4 before each prompt's end, and 4 before it.
UBATCH = 512
CHECKPOINT_MARGIN = UBATCH + 4
AGENT_PROMPT = 30_000  # tokens of Claude Code's tools and agent prompt, at the least


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    model = tmp_path_factory.mktemp("model") / "qwen35-long.gguf"
    write_qwen35(model, Qwen35Config(n_ctx=131072, bigram=True, mtp=Mtp.IDENTITY))
    return Setup(
        claude=client("node", "node_modules", ".bin", "claude"),
        llama_server=llama_server_binary(),
        template=chat_template(QWEN35),
        model=model,
    )


def test_each_turn_reuses_the_previous_prompt(setup: Setup, tmp_path: Path) -> None:
    figures = measure_turns(setup, tmp_path)
    assert figures["exits"] == [0, 0, 0, 0], figures
    requests = figures["requests"]
    assert [r["status"] for r in requests] == [200] * len(requests), figures
    assert {r["step"][0] for r in requests} == {"1", "2", "3", "4"}, figures
    # On failure: every request in one line each, and llama-server's account of its cache.
    account = "\n".join(
        [str({k: r[k] for k in ("step", "context_tokens", "cached_tokens", "previous_context")})
         for r in requests] + figures["cache_events"]
    )  # fmt: skip
    for before, request in pairwise(requests):
        previous = request["previous_context"]
        assert previous > AGENT_PROMPT, account
        if request["step"] == before["step"]:  # Claude Code's resend within a turn: see below
            assert request["cached_tokens"] >= AGENT_PROMPT, account
        else:
            assert request["cached_tokens"] >= previous - CHECKPOINT_MARGIN, account


def test_a_resend_after_an_answer_with_no_text_keeps_the_agent_prompt(
    setup: Setup, tmp_path: Path
) -> None:
    figures = measure_resend(setup, tmp_path)
    first, resent = figures["requests"][:2]
    assert [first["status"], resent["status"]] == [200, 200], figures
    assert resent["context_tokens"] > first["context_tokens"] > AGENT_PROMPT, figures
    assert resent["cached_tokens"] >= AGENT_PROMPT, figures


def test_a_new_session_in_the_same_directory_reuses_the_agent_prompt(
    setup: Setup, tmp_path: Path
) -> None:
    figures = measure_sessions(setup, tmp_path, session_prefix=True)
    # Each session's first request is what counts; Claude Code may ask again when the tiny
    # model's sampled answer comes back empty (its own retry: one more 200).
    assert figures["first"] and figures["second"], figures
    assert all(r["status"] == 200 for r in figures["first"] + figures["second"]), figures
    second = figures["second"][0]
    # Up to the checkpoint at the start of the system text: the tools and the agent prompt
    # stay; the environment turn and the new prompt come after it.
    assert second["cached_tokens"] >= 0.75 * second["context_tokens"], figures

"""Late system/developer messages for a template that refuses them (proxy/compat/system_turns.py),
on the bodies real agents sent (tests/fixtures/compat: Claude Code 2.1.332, Codex 0.171.0).

Whether the refusing template would take a body is judged as llama-server builds the template's
messages (simulator/template.py, the simulator's model of Qwen3.5/3.6's refusal); whether the
prefix cache holds is judged on the ChatML prompt the simulator renders from the same body.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.apis import Api
from proxy.compat.outcome import Unmendable
from proxy.compat.system_turns import mend_system_turns, needs_rewrite, reminder
from simulator.prompts import chat_prompt, messages_prompt, responses_prompt
from simulator.template import (
    TemplateRefused,
    chat_turns,
    check_template,
    messages_turns,
    responses_turns,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compat"
CLAUDE_TURNS = [f"claude-code-turn{n}.json" for n in range(1, 6)]
TURNS = {"chat": chat_turns, "messages": messages_turns, "responses": responses_turns}
SYSTEM = {"role": "system", "content": "S"}
USER = {"role": "user", "content": "u"}
PROMPTS = {"chat": chat_prompt, "messages": messages_prompt, "responses": responses_prompt}


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text("utf-8"))
    return body


def refused(api: Api, body: dict[str, Any]) -> bool:
    try:
        check_template(TURNS[api](body))
    except TemplateRefused:
        return True
    return False


def prompt(api: Api, body: dict[str, Any]) -> str:
    """The rendered conversation, without the trailing generation prompt."""
    return PROMPTS[api](body).text.removesuffix("<|im_start|>assistant\n")


# --- Claude Code ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*CLAUDE_TURNS, "claude-code-say-hi.json"])
def test_claude_code_requests_are_refused_as_sent_and_taken_once_mended(name: str) -> None:
    body = fixture(name)
    assert refused("messages", body)  # its system turn sits after the first user turn
    mended = mend_system_turns("messages", body)
    assert not refused("messages", mended)


def test_claude_code_system_turns_become_user_reminders_where_they_stand() -> None:
    body = fixture("claude-code-turn4.json")
    mended = mend_system_turns("messages", body)
    assert mended["system"] == body["system"]  # the leading system blocks, untouched
    assert len(mended["messages"]) == len(body["messages"])
    for before, after in zip(body["messages"], mended["messages"], strict=True):
        if before["role"] != "system":
            assert after is before  # every other message is the client's own object
            continue
        content = before["content"]
        text = content if isinstance(content, str) else "".join(b["text"] for b in content)
        assert after == {"role": "user", "content": reminder(text)}
    # The session's two system turns: the first environment, then the update after `git init`.
    texts = [m["content"] for m in mended["messages"] if isinstance(m["content"], str)]
    assert sum(t.startswith("<system-reminder>\n# Environment") for t in texts) == 2


def test_each_turn_of_a_claude_code_session_extends_the_previous_prompt() -> None:
    """The prefix cache holds: turn N's prompt, mended, is a byte prefix of turn N+1's, across
    a tool loop, a new user turn, and a new system turn (turn 4: the environment changed)."""
    prompts = [prompt("messages", mend_system_turns("messages", fixture(n))) for n in CLAUDE_TURNS]
    for before, after in itertools.pairwise(prompts):
        assert after.startswith(before)


def test_the_first_and_later_forms_of_a_system_turn_render_alike() -> None:
    """Claude Code sends a system turn as text blocks with cache_control on the first request
    and as a plain string afterwards: mended, both are the same message."""
    first, second = fixture("claude-code-turn1.json"), fixture("claude-code-turn2.json")
    assert isinstance(first["messages"][1]["content"], list)
    assert isinstance(second["messages"][1]["content"], str)
    mended = [mend_system_turns("messages", b)["messages"][1] for b in (first, second)]
    assert mended[0] == mended[1]


# --- Codex ----------------------------------------------------------------------------------------


def test_codex_leading_developer_items_merge_into_one() -> None:
    body = fixture("codex-named-model.json")
    developer = [x for x in body["input"] if x.get("role") == "developer"]
    assert len(developer) == 2 and refused("responses", body)
    mended = mend_system_turns("responses", body)
    assert not refused("responses", mended)
    texts = ["".join(p["text"] for p in d["content"]) for d in developer]
    assert mended["input"][0] == {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "\n\n".join(texts)}],
    }
    assert mended["input"][1:] == body["input"][2:]


def test_instructions_and_leading_items_merge_into_the_instructions() -> None:
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "input_text", "text": "Later."}]},
        ],
    }
    assert refused("responses", body)
    mended = mend_system_turns("responses", body)
    assert mended["instructions"] == "Be brief.\n\nUse tools."
    assert mended["input"] == [
        {"role": "user", "content": "hi"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": reminder("Later.")}],
        },
    ]
    assert not refused("responses", mended)


# --- chat: gptme's three system messages, and the shapes around -----------------------------------


def test_gptme_three_leading_system_messages_merge() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are gptme."},
            {"role": "system", "content": [{"type": "text", "text": "Tools: shell."}]},
            {"role": "system", "content": "Workspace: /tmp/w"},
            {"role": "user", "content": "hi"},
        ]
    }
    assert refused("chat", body)
    mended = mend_system_turns("chat", body)
    assert mended["messages"] == [
        {
            "role": "system",
            "content": "You are gptme.\n\nTools: shell.\n\nWorkspace: /tmp/w",
        },
        {"role": "user", "content": "hi"},
    ]
    assert not refused("chat", mended)


def test_a_chat_conversation_keeps_its_prefix_when_a_system_message_arrives() -> None:
    turn1 = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "1"},
            {"role": "user", "content": "two"},
        ]
    }
    turn2 = copy.deepcopy(turn1)
    turn2["messages"] += [
        {"role": "assistant", "content": "2"},
        {"role": "developer", "content": "The date changed."},
        {"role": "user", "content": "three"},
    ]
    before = prompt("chat", mend_system_turns("chat", turn1))
    after = prompt("chat", mend_system_turns("chat", turn2))
    assert after.startswith(before)
    assert not refused("chat", mend_system_turns("chat", turn2))


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (
            "chat",
            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]},
        ),
        ("chat", {"messages": [USER]}),
        ("messages", {"system": "S", "messages": [USER]}),
        ("responses", {"instructions": "S", "input": "u"}),
        (
            "responses",
            {"input": [{"role": "developer", "content": "S"}, {"role": "user", "content": "u"}]},
        ),
        ("completions", {"prompt": "u"}),
    ],
)
def test_a_body_the_template_takes_is_the_same_object(api: Api, body: dict[str, Any]) -> None:
    assert not needs_rewrite(api, body)
    assert mend_system_turns(api, body) is body


def test_codex_additional_tools_item_is_not_a_system_message() -> None:
    body = {
        "input": [
            {"role": "developer", "content": "S"},
            {"role": "user", "content": "u"},
            {"type": "additional_tools", "role": "developer", "tools": []},
        ]
    }
    assert not needs_rewrite("responses", body)


def test_leading_system_messages_inside_anthropic_messages_join_the_system() -> None:
    body = {
        "system": [{"type": "text", "text": "A"}],
        "messages": [{"role": "system", "content": "B"}, {"role": "user", "content": "u"}],
    }
    mended = mend_system_turns("messages", body)
    assert mended["system"] == [{"type": "text", "text": "A"}, {"type": "text", "text": "\n\nB"}]
    assert mended["messages"] == [{"role": "user", "content": "u"}]
    assert not refused("messages", mended)


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ("chat", {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
        ("messages", {"role": "system", "content": [{"type": "image", "source": {}}]}),
        (
            "responses",
            {"role": "developer", "content": [{"type": "input_image", "image_url": "x"}]},
        ),
        ("chat", {"role": "system", "content": 42}),
    ],
)
def test_a_system_message_that_is_not_text_cannot_be_mended(
    api: Api, message: dict[str, Any]
) -> None:
    key = "input" if api == "responses" else "messages"
    body = {key: [{"role": "user", "content": "u"}, message]}
    with pytest.raises(Unmendable, match="not text"):
        mend_system_turns(api, body)


def test_the_client_body_is_never_changed() -> None:
    body = fixture("claude-code-turn4.json")
    kept = copy.deepcopy(body)
    mend_system_turns("messages", body)
    assert body == kept

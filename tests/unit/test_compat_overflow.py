"""llama-server's context overflow as each API's canonical error (proxy/compat/overflow.py).

The llama-server body is the pinned build's answer to a prompt over `-c 256`, the canonical ones
are the providers' (Anthropic's, OpenAI's Chat Completions and Responses errors)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.apis import Api
from proxy.compat.overflow import RESPONSES_MESSAGE, canonical_overflow

LLAMA_SERVER = {
    "error": {
        "code": 400,
        "message": "request (818 tokens) exceeds the available context size (256 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 818,
        "n_ctx": 256,
    }
}


def mapped(api: Api, body: dict[str, Any] = LLAMA_SERVER) -> Any:
    out = canonical_overflow(api, json.dumps(body).encode())
    return None if out is None else json.loads(out)


def test_anthropic_gets_prompt_is_too_long() -> None:
    assert mapped("messages") == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 818 tokens > 256 maximum",
        },
    }


def test_chat_gets_context_length_exceeded() -> None:
    assert mapped("chat") == {
        "error": {
            "message": "This model's maximum context length is 256 tokens. However, your "
            "messages resulted in 818 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_completions_name_the_prompt() -> None:
    error = mapped("completions")["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert "256 tokens" in error["message"] and "818 tokens" in error["message"]


def test_responses_get_openai_s_message() -> None:
    assert mapped("responses") == {
        "error": {
            "message": RESPONSES_MESSAGE,
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


def test_the_sizes_come_from_the_message_when_the_fields_are_missing() -> None:
    error = {
        k: v for k, v in LLAMA_SERVER["error"].items() if k not in ("n_prompt_tokens", "n_ctx")
    }
    assert mapped("messages", {"error": error})["error"]["message"] == (
        "prompt is too long: 818 tokens > 256 maximum"
    )


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": 400, "message": "Cannot determine type of 'item'", "type": "x"}},
        {"error": {"type": "exceed_context_size_error", "message": "no sizes"}},
        {"error": "exceed_context_size_error"},
        ["exceed_context_size_error"],
    ],
)
def test_other_errors_are_not_touched(body: Any) -> None:
    assert mapped("chat", body) is None


def test_a_body_that_is_not_json_is_not_touched() -> None:
    assert canonical_overflow("chat", b"exceed_context_size_error {") is None

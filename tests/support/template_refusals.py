"""Bodies the Qwen3.5/3.6 chat template refuses, and the words it refuses them with, on every
route that renders it: measured on the pinned llama-server (tests/llama/test_chat_templates.py)
and copied by the simulator (tests/simulator/test_simulator_template.py, simulator/template.py).
"""

from __future__ import annotations

from typing import Any

NO_USER_QUERY = "No user query found in messages."
NO_MESSAGES = "No messages provided."
SYSTEM = {"role": "system", "content": "s"}
ASSISTANT = {"role": "assistant", "content": "a"}
TOOL_RESPONSE = "<tool_response>x</tool_response>"
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "r"}

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"messages": [SYSTEM], "max_tokens": 2}, NO_USER_QUERY),
    ("/v1/chat/completions", {"messages": [SYSTEM, ASSISTANT], "max_tokens": 2}, NO_USER_QUERY),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": f" {TOOL_RESPONSE}\n"}], "max_tokens": 2},
        NO_USER_QUERY,
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": TOOL_RESPONSE}]}],
            "max_tokens": 2,
        },
        NO_USER_QUERY,
    ),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 2}, NO_MESSAGES),
    ("/apply-template", {"messages": [SYSTEM]}, NO_USER_QUERY),
    ("/v1/messages", {"max_tokens": 2, "system": "s", "messages": [ASSISTANT]}, NO_USER_QUERY),
    (
        "/v1/messages",
        {"max_tokens": 2, "messages": [{"role": "user", "content": [TOOL_RESULT]}]},
        NO_USER_QUERY,
    ),
    ("/v1/messages", {"max_tokens": 2, "messages": []}, NO_MESSAGES),
    ("/v1/messages", {"max_tokens": 2, "system": "s", "messages": []}, NO_USER_QUERY),
    ("/v1/messages/count_tokens", {"system": "s", "messages": [ASSISTANT]}, NO_USER_QUERY),
    ("/v1/responses", {"instructions": "s", "input": [], "max_output_tokens": 2}, NO_USER_QUERY),
    ("/v1/responses", {"input": [], "max_output_tokens": 2}, NO_MESSAGES),
]
TAKEN: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "", "max_output_tokens": 2}),  # an empty query is one
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "1", "content": "r"},
            ],
            "max_tokens": 2,
        },
    ),
]

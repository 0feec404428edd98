"""A context overflow, in the words each API's clients act on.

llama-server answers a prompt longer than its context, on every API and before any byte of a
stream, with its own 400: ``{"error": {"code": 400, "type": "exceed_context_size_error",
"message": "request (818 tokens) exceeds the available context size (256 tokens), try increasing
it", "n_prompt_tokens": 818, "n_ctx": 256}}``. Agents look for their provider's error to compact
or stop instead of retrying: Claude Code parses Anthropic's "prompt is too long: N tokens > M
maximum" (and then compacts without first resending the whole history), Codex reads OpenAI's
``context_length_exceeded`` ("Codex ran out of room in the model's context window"). The shapes
are those the providers answer (quoted in public issues): Anthropic's ``invalid_request_error``;
OpenAI's ``{"message", "type": "invalid_request_error", "param", "code":
"context_length_exceeded"}`` with Chat Completions' message naming both sizes and Responses'
fixed message.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.apis import Api
from proxy.compat.llama_errors import llama_error

OVERFLOW_TYPE = "exceed_context_size_error"
_SIZES = re.compile(r"\((\d+) tokens\).*\((\d+) tokens\)")
RESPONSES_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)


def canonical_overflow(api: Api, body: bytes) -> bytes | None:
    """llama-server's overflow answer as the API's canonical error body; None if `body` is
    not one."""
    if OVERFLOW_TYPE.encode() not in body:  # one byte search for every other error
        return None
    error = llama_error(body)
    if error is None or error.get("type") != OVERFLOW_TYPE:
        return None
    sizes = _sizes(error)
    if sizes is None:
        return None
    return orjson.dumps(_canonical(api, *sizes))


def _sizes(error: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, context size), from the fields or else the message."""
    prompt, context = error.get("n_prompt_tokens"), error.get("n_ctx")
    if isinstance(prompt, int) and isinstance(context, int):
        return prompt, context
    found = _SIZES.search(str(error.get("message", "")))
    return (int(found[1]), int(found[2])) if found else None


def _canonical(api: Api, prompt: int, context: int) -> dict[str, Any]:
    if api == "messages":
        message = f"prompt is too long: {prompt} tokens > {context} maximum"
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if api == "responses":
        message, param = RESPONSES_MESSAGE, "input"
    else:
        what = "messages" if api == "chat" else "prompt"
        message = (
            f"This model's maximum context length is {context} tokens. However, your {what} "
            f"resulted in {prompt} tokens. Please reduce the length of the {what}."
        )
        param = what
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": "context_length_exceeded",
        }
    }

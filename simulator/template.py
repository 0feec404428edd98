"""What the simulated chat template refuses: Qwen3.5/3.6's refusals, when asked to.

llama-server renders each chat request with the model's Jinja template, and answers 500 with the
Jinja trace on every route that renders one (generation, token counting, /apply-template) when
the template raises. The Qwen3.5/3.6 template raises, in this order:
- "No messages provided." for an empty list of messages;
- "No user query found in messages." when no user message is a query: none at all (a system
  prompt alone, or only assistant turns), or only tool results (a tool result is a "tool"
  message, and a user message whose text is one `<tool_response>` block is one too);
- "System message must be at the beginning." for a system message anywhere but first
  (llama-server maps ``developer`` to ``system`` before the template).
The presets that model a Qwen3.5/3.6 model turn this on (``[chat_template]
refuse_late_system``, named for the refusal real agents meet; ``--[no-]refuse-late-system``
overrides it), so the demo and the fast tests meet the same refusals as a real box. The
template's "Unexpected message role." is not modelled.

The turns are those llama-server hands to the template after converting each API's body: each
message's role, and a user message's text (what the "user query" test reads).
"""

from __future__ import annotations

from typing import Any

Turn = tuple[str, str]
"""A message as the template sees it: its role, and its text when it is a user message."""


def _jinja_error(line: int, column: int, excerpt: str, words: str) -> str:
    """llama-server's message when the template raises (the pinned build), byte for byte."""
    return (
        f"\n------------\nWhile executing CallExpression at line {line}, column {column} in "
        f"source:\n{excerpt}\n"
        "                                           ^\n"
        f"Error: Jinja Exception: {words}"
    )


# llama-server's answers for the Qwen3.5-4B template (the pinned build), byte for byte.
LATE_SYSTEM_ERROR = _jinja_error(
    85,
    32,
    "...first %}\u21b5            {{- raise_exception('System message must be at the beginnin...",
    "System message must be at the beginning.",
)
NO_USER_QUERY_ERROR = _jinja_error(
    79,
    24,
    "...lti_step_tool %}\u21b5    {{- raise_exception('No user query found in messages.') }}"
    "\u21b5...",
    "No user query found in messages.",
)
NO_MESSAGES_ERROR = _jinja_error(
    43,
    24,
    "... not messages %}\u21b5    {{- raise_exception('No messages provided.') }}"
    "\u21b5{%- endif %...",
    "No messages provided.",
)
_SYSTEM = frozenset({"system", "developer"})


class TemplateRefused(Exception):
    """The template raised: llama-server answers 500 with the message as its error."""


def check_template(turns: list[Turn]) -> None:
    """Raise TemplateRefused where the Qwen3.5/3.6 template raises, in its order."""
    if not turns:
        raise TemplateRefused(NO_MESSAGES_ERROR)
    if not any(role == "user" and not _tool_response(text) for role, text in turns):
        raise TemplateRefused(NO_USER_QUERY_ERROR)
    if any(role in _SYSTEM for role, _ in turns[1:]):
        raise TemplateRefused(LATE_SYSTEM_ERROR)


def _tool_response(text: str) -> bool:
    text = text.strip()
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


def chat_turns(body: dict[str, Any]) -> list[Turn]:
    """/v1/chat/completions and /apply-template: the messages as given."""
    messages = body.get("messages")
    return [_turn(m) for m in messages] if isinstance(messages, list) else []


def messages_turns(body: dict[str, Any]) -> list[Turn]:
    """/v1/messages, as llama-server's Anthropic converter builds them: a top-level `system`
    first, a message of blocks only if it keeps text, thinking or a tool call, then one "tool"
    message per tool result."""
    turns: list[Turn] = [] if body.get("system") is None else [("system", "")]
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        role, text = _turn(message)
        if not isinstance(message, dict) or "content" not in message:
            if role != "assistant":  # an assistant message without content is skipped
                turns.append((role, text))
            continue
        content = message["content"]
        if not isinstance(content, list):
            turns.append((role, text))
            continue
        kinds = [b.get("type") for b in content if isinstance(b, dict)]
        if any(k in ("text", "thinking", "tool_use", "image") for k in kinds):
            turns.append((role, text))
        turns += [("tool", "")] * kinds.count("tool_result")
    return turns


def responses_turns(body: dict[str, Any]) -> list[Turn]:
    """/v1/responses, as llama-server's converter builds them: `instructions` first, then each
    item (consecutive assistant items merge into one message)."""
    turns: list[Turn] = [("system", "")] if "instructions" in body else []
    items = body.get("input")
    if isinstance(items, str):
        return [*turns, ("user", items)]
    for item in items if isinstance(items, list) else []:
        role, text = _item_turn(item)
        if role == "assistant" and turns and turns[-1][0] == "assistant":
            continue
        turns.append((role, text))
    return turns


def _item_turn(item: Any) -> Turn:
    if not isinstance(item, dict):
        return "", ""
    kind = item.get("type")
    if kind == "function_call_output":
        return "tool", ""
    if kind in ("function_call", "reasoning"):
        return "assistant", ""
    return _turn(item)


def _turn(message: Any) -> Turn:
    """A message's role, and its text if it is a user message (its text parts, joined)."""
    if not isinstance(message, dict):
        return "", ""
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    if role != "user":
        return role, ""
    content = message.get("content")
    if isinstance(content, str):
        return role, content
    parts = content if isinstance(content, list) else []
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    return role, "".join(t for t in texts if isinstance(t, str))

"""What the simulated chat template refuses: Qwen3.5/3.6's late system message, when asked to.

llama-server renders each chat request with the model's Jinja template. The Qwen3.5/3.6 template
raises "System message must be at the beginning." for a system message anywhere but first, and
llama-server answers 500 on every route that renders one (generation, token counting,
/apply-template). It maps ``developer`` to ``system`` before the template, so a late developer
message is refused too. The presets that model a Qwen3.5/3.6 model turn this on
(``[chat_template] refuse_late_system``; ``--[no-]refuse-late-system`` overrides it), so the demo
and the fast tests meet the same refusal as a real box. The template's other refusals ("No user
query found in messages.", "Unexpected message role.") are not modelled.

The roles are those llama-server hands to the template after converting each API's body.
"""

from __future__ import annotations

from typing import Any

# llama-server's answer for the Qwen3.5-4B template (the pinned build), byte for byte.
LATE_SYSTEM_ERROR = (
    "\n------------\nWhile executing CallExpression at line 85, column 32 in source:\n"
    "...first %}\u21b5            {{- raise_exception('System message must be at the beginnin...\n"
    "                                           ^\n"
    "Error: Jinja Exception: System message must be at the beginning."
)
_SYSTEM = frozenset({"system", "developer"})


class TemplateRefused(Exception):
    """The template raised: llama-server answers 500 with the message as its error."""


def check_late_system(roles: list[str]) -> None:
    """Raise TemplateRefused if a system (or developer) message is not the first message."""
    if any(role in _SYSTEM for role in roles[1:]):
        raise TemplateRefused(LATE_SYSTEM_ERROR)


def chat_roles(body: dict[str, Any]) -> list[str]:
    """/v1/chat/completions and /apply-template: the messages as given."""
    messages = body.get("messages")
    return [_role(m) for m in messages] if isinstance(messages, list) else []


def messages_roles(body: dict[str, Any]) -> list[str]:
    """/v1/messages, as llama-server's Anthropic converter builds them: a top-level `system`
    first, a message of blocks only if it keeps text, thinking or a tool call, then one "tool"
    message per tool result."""
    roles = [] if body.get("system") is None else ["system"]
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        role = _role(message)
        if not isinstance(message, dict) or "content" not in message:
            if role != "assistant":  # an assistant message without content is skipped
                roles.append(role)
            continue
        content = message["content"]
        if not isinstance(content, list):
            roles.append(role)
            continue
        kinds = [b.get("type") for b in content if isinstance(b, dict)]
        if any(k in ("text", "thinking", "tool_use", "image") for k in kinds):
            roles.append(role)
        roles += ["tool"] * kinds.count("tool_result")
    return roles


def responses_roles(body: dict[str, Any]) -> list[str]:
    """/v1/responses, as llama-server's converter builds them: `instructions` first, then each
    item (consecutive assistant items merge into one message)."""
    roles = ["system"] if "instructions" in body else []
    items = body.get("input")
    if isinstance(items, str):
        return [*roles, "user"]
    for item in items if isinstance(items, list) else []:
        role = _item_role(item)
        if role == "assistant" and roles and roles[-1] == "assistant":
            continue
        roles.append(role)
    return roles


def _item_role(item: Any) -> str:
    if not isinstance(item, dict):
        return ""
    kind = item.get("type")
    if kind == "function_call_output":
        return "tool"
    if kind in ("function_call", "reasoning"):
        return "assistant"
    return _role(item)


def _role(message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else ""

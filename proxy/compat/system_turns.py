"""System and developer messages that are not first, for a chat template that refuses them.

Qwen3.5/3.6's template raises "System message must be at the beginning." for a second system
message anywhere (llama-server maps ``developer`` to ``system`` first, and turns Anthropic's
top-level ``system`` and Responses' ``instructions`` into a leading system message): Claude Code's
mid-conversation system turns, Codex's several developer items and gptme's three system messages
all get a 500. The rewrite:

- the leading run of system/developer messages (with ``system`` / ``instructions``) becomes one
  system message, the texts joined by a blank line; a single one is left as it is;
- every later one becomes, where it stands, a user message
  ``<system-reminder>\\n{text}\\n</system-reminder>`` (Claude Code's own convention for the same
  facts when it talks to models without system turns).

Why in place, not folded into the first system message: every earlier byte of the prompt stays
as it was on the previous turn, so llama-server's prefix cache keeps it. Claude Code appends a new
system turn when its environment changes; folding it into the leading message would change the
prompt right after the tools, and the whole conversation would be prefilled again (on a hybrid
Qwen3.5/3.6 model the whole prompt: its context checkpoints lie at user turns).

A message whose content is not all text (an image) cannot be rewritten: Unmendable.
"""

from __future__ import annotations

from typing import Any

from proxy.apis import Api
from proxy.compat.outcome import Unmendable

SYSTEM_ROLES = frozenset({"system", "developer"})
OPEN, CLOSE = "<system-reminder>\n", "\n</system-reminder>"
JOIN = "\n\n"
_TEXT_PART = {"chat": "text", "messages": "text", "responses": "input_text"}


def needs_rewrite(api: Api, body: dict[str, Any]) -> bool:
    """Whether the body has a system message the refusing template would raise on."""
    items, leading_extra = _listing(api, body)
    if items is None:
        return False
    lead = _leading_end(api, items)
    return lead + leading_extra > 1 or any(_is_system(api, m) for m in items[lead:])


def mend_system_turns(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    """The body with one leading system message and later ones in place as user reminders;
    the same object when nothing needs it. Raises Unmendable."""
    if not needs_rewrite(api, body):
        return body
    if api == "chat":
        return _chat(body)
    if api == "messages":
        return _messages(body)
    return _responses(body)


def reminder(text: str) -> str:
    return f"{OPEN}{text}{CLOSE}"


def _listing(api: Api, body: dict[str, Any]) -> tuple[list[Any] | None, int]:
    """The body's message list, and how many system messages lead before it (system,
    instructions)."""
    if api == "chat":
        items = body.get("messages")
        extra = 0
    elif api == "messages":
        items = body.get("messages")
        extra = 0 if body.get("system") is None else 1
    elif api == "responses":
        items = body.get("input")
        extra = 1 if "instructions" in body else 0
    else:
        return None, 0
    return (items, extra) if isinstance(items, list) else (None, 0)


def _is_system(api: Api, message: Any) -> bool:
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(role, str) or role not in SYSTEM_ROLES:
        return False
    # A Responses item with a role is a message only without a type or with type "message"
    # (Codex's additional_tools item carries role "developer").
    return api != "responses" or message.get("type", "message") == "message"


def _leading_end(api: Api, items: list[Any]) -> int:
    end = 0
    while end < len(items) and _is_system(api, items[end]):
        end += 1
    return end


def _text(api: Api, message: dict[str, Any]) -> str:
    """The text of a system message, as the template renders it (parts joined as they are)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    wanted = _TEXT_PART[api]
    if not isinstance(content, list):
        raise Unmendable(f"a {message.get('role')} message's content is not text")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if kind != wanted or not isinstance(text, str):
            raise Unmendable(f"a {message.get('role')} message has a {kind!r} part, not text only")
        texts.append(text)
    return "".join(texts)


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    messages: list[Any] = body["messages"]
    lead = _leading_end("chat", messages)
    out: list[Any] = []
    if lead > 1:
        merged = JOIN.join(_text("chat", m) for m in messages[:lead])
        out.append({"role": messages[0]["role"], "content": merged})
    else:
        out += messages[:lead]
    out += [_in_place("chat", m) for m in messages[lead:]]
    return {**body, "messages": out}


def _messages(body: dict[str, Any]) -> dict[str, Any]:
    messages: list[Any] = body["messages"]
    lead = _leading_end("messages", messages)
    out = dict(body)
    if lead:
        texts = [_text("messages", m) for m in messages[:lead]]
        out["system"] = _with_system_texts(body.get("system"), texts)
    out["messages"] = [_in_place("messages", m) for m in messages[lead:]]
    return out


def _with_system_texts(system: Any, texts: list[str]) -> Any:
    """Anthropic's top-level `system` with the texts of leading system messages after it."""
    joined = JOIN.join(texts)
    if system is None:
        return joined
    if isinstance(system, str):
        return system + JOIN + joined
    if isinstance(system, list):  # llama-server joins the blocks with nothing between
        return [*system, {"type": "text", "text": JOIN + joined}]
    raise Unmendable("the top-level system is neither text nor a list of blocks")


def _responses(body: dict[str, Any]) -> dict[str, Any]:
    items: list[Any] = body["input"]
    lead = _leading_end("responses", items)
    out = dict(body)
    head: list[Any] = []
    if "instructions" in body and lead:
        instructions = body["instructions"]
        if not isinstance(instructions, str | None):
            raise Unmendable("'instructions' is not text")
        texts = [instructions or "", *(_text("responses", m) for m in items[:lead])]
        out["instructions"] = JOIN.join(texts)
    elif lead > 1:
        merged = JOIN.join(_text("responses", m) for m in items[:lead])
        head.append(
            {
                "type": "message",
                "role": items[0]["role"],
                "content": [{"type": "input_text", "text": merged}],
            }
        )
    else:
        head += items[:lead]
    out["input"] = head + [_in_place("responses", item) for item in items[lead:]]
    return out


def _in_place(api: Api, message: Any) -> Any:
    """A message after the leading ones: a system one becomes a user reminder where it stands."""
    if not _is_system(api, message):
        return message
    text = reminder(_text(api, message))
    if api == "responses":
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
    return {"role": "user", "content": text}

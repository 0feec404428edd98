"""Request bodies of each API -> one chat-template prompt (ChatML, as Qwen models use).

Every part of a conversation (system, tools, text blocks, tool calls, tool results) is rendered
deterministically, so turn N+1 of a conversation starts with exactly the text of turn N plus the
answer: the slot's prefix cache then reuses it, as with a real chat template.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

START = "<|im_start|>"
END = "<|im_end|>"


class BadRequest(ValueError):
    """The body is not a valid request for this API (HTTP 400)."""


@dataclass(frozen=True)
class Prompt:
    text: str
    last_user: str  # the latest user text: what the answer is about


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _turn(role: str, content: str) -> str:
    return f"{START}{role}\n{content}{END}\n"


def _parts_text(content: Any) -> str:
    """OpenAI/Anthropic/Responses content: a string or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or an array of parts")
    out: list[str] = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise BadRequest("content parts must be objects")
        kind = part.get("type", "text")
        if kind in ("text", "input_text", "output_text"):
            out.append(str(part.get("text", "")))
        elif kind in ("image_url", "image", "input_image"):
            out.append("<|vision_start|><|image_pad|><|vision_end|>")
        elif kind == "tool_use":
            out.append(_tool_call(part.get("name"), part.get("input", {})))
        elif kind == "tool_result":
            out.append(_tool_response(_parts_text(part.get("content"))))
        elif kind == "thinking":
            out.append(f"<think>\n{part.get('thinking', '')}\n</think>\n")
    return "".join(out)


def _tool_call(name: Any, arguments: Any) -> str:
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return f"\n<tool_call>\n{_dump({'name': name, 'arguments': arguments})}\n</tool_call>"


def _tool_response(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>"


def _system(system: str, tools: Any) -> str:
    if isinstance(tools, list) and tools:
        listing = "\n".join(_dump(t) for t in tools)
        system = f"{system}\n\n# Tools\n\n<tools>\n{listing}\n</tools>".lstrip("\n")
    return _turn("system", system) if system else ""


def _finish(parts: list[str], last_user: str) -> Prompt:
    return Prompt("".join(parts) + f"{START}assistant\n", last_user)


def _require_list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list) or not value:
        raise BadRequest(f"'{key}' is required and must be a non-empty array")
    return value


def chat_prompt(body: dict[str, Any]) -> Prompt:
    """OpenAI /v1/chat/completions messages."""
    messages = _require_list(body, "messages")
    system = ""
    parts: list[str] = []
    last_user = ""
    for msg in messages:
        if not isinstance(msg, dict) or "role" not in msg:
            raise BadRequest("each message must be an object with a 'role'")
        role = str(msg["role"])
        text = _parts_text(msg.get("content"))
        if role in ("system", "developer") and not parts:
            system = f"{system}\n{text}" if system else text
        elif role == "assistant":
            for call in msg.get("tool_calls") or []:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                text += _tool_call(fn.get("name"), fn.get("arguments", {}))
            parts.append(_turn("assistant", text))
        elif role == "tool":
            parts.append(_turn("user", _tool_response(text)))
        else:
            parts.append(_turn(role, text))
            last_user = text
    return _finish([_system(system, body.get("tools")), *parts], last_user)


def completion_prompt(body: dict[str, Any]) -> Prompt:
    """OpenAI /v1/completions prompt (a string, or the first of a list of strings)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' is required and must be a string")
    return Prompt(prompt, prompt)


def messages_prompt(body: dict[str, Any]) -> Prompt:
    """Anthropic /v1/messages."""
    messages = _require_list(body, "messages")
    tools = body.get("tools")
    if isinstance(tools, list):
        tools = [{"type": "function", "function": t} for t in tools]
    parts: list[str] = [_system(_parts_text(body.get("system")), tools)]
    last_user = ""
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise BadRequest("each message must have role 'user' or 'assistant'")
        text = _parts_text(msg.get("content"))
        parts.append(_turn(str(msg["role"]), text))
        if msg["role"] == "user":
            last_user = text
    return _finish(parts, last_user)


def responses_prompt(body: dict[str, Any]) -> Prompt:
    """OpenAI /v1/responses: instructions + input (a string or a list of items)."""
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise BadRequest("'input' is required")
    system = str(body.get("instructions") or "")
    parts: list[str] = []
    last_user = ""
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("input items must be objects")
        kind = item.get("type", "message")
        if kind == "function_call":
            parts.append(_turn("assistant", _tool_call(item.get("name"), item.get("arguments"))))
        elif kind == "function_call_output":
            parts.append(_turn("user", _tool_response(str(item.get("output", "")))))
        elif kind == "message":
            role = str(item.get("role", "user"))
            text = _parts_text(item.get("content"))
            if role in ("system", "developer") and not parts:
                system = f"{system}\n{text}" if system else text
                continue
            parts.append(_turn(role, text))
            if role == "user":
                last_user = text
    return _finish([_system(system, body.get("tools")), *parts], last_user)

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


def infill_prompt(body: dict[str, Any]) -> Prompt:
    """llama-server's /infill: `input_prefix` and `input_suffix` (required), `prompt` (the text
    the cursor sits after) and `input_extra` (context chunks), as one prompt."""
    prefix, suffix = body.get("input_prefix"), body.get("input_suffix")
    if not isinstance(prefix, str) or not isinstance(suffix, str):
        raise BadRequest("'input_prefix' and 'input_suffix' are required strings")
    prompt = body.get("prompt", "")
    extra = body.get("input_extra") or []
    if not isinstance(prompt, str) or not isinstance(extra, list):
        raise BadRequest("'prompt' must be a string and 'input_extra' a list")
    chunks = [c.get("text", "") for c in extra if isinstance(c, dict)]
    text = "".join(str(c) for c in chunks) + prefix + prompt + suffix
    return Prompt(text, text)


def messages_prompt(body: dict[str, Any]) -> Prompt:
    """Anthropic /v1/messages, as llama-server converts it: any role (Claude Code sends `system`
    turns after the first user turn), unknown block types dropped, tool results as text."""
    messages = _require_list(body, "messages")
    tools = body.get("tools")
    if isinstance(tools, list):
        tools = [{"type": "function", "function": t} for t in tools]
    system = body.get("system")
    parts: list[str] = [
        _system(_parts_text(system) if isinstance(system, str | list) else "", tools)
    ]
    last_user = ""
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest("Failed to parse messages: Missing 'role' in message")
        if "content" not in msg and msg["role"] == "assistant":
            continue
        text = _parts_text(msg.get("content"))
        parts.append(_turn(msg["role"], text))
        if msg["role"] == "user":
            last_user = text
    return _finish(parts, last_user)


_INPUT_PARTS = frozenset({"input_text", "input_image"})
_OUTPUT_PARTS = frozenset({"output_text", "input_text", "refusal"})
_INPUT_ROLES = frozenset({"user", "system", "developer"})


def _string(item: dict[str, Any], *keys: str) -> bool:
    return all(isinstance(item.get(key), str) for key in keys)


def _checked_parts(content: list[Any], allowed: frozenset[str], message: str) -> list[Any]:
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_file":
            raise BadRequest("'input_file' is not supported by llamacpp at this moment")
        if kind not in allowed:
            raise BadRequest(message)
    return content


def _response_item(item: Any) -> tuple[str, str]:
    """One Responses input item -> (role, rendered text), accepting what llama-server accepts
    (server_chat_convert_responses_to_chatcmpl): messages of any input role, assistant output
    messages, function calls and their outputs, reasoning items."""
    if not isinstance(item, dict):
        raise BadRequest("'input' must be a string or array of objects")
    kind, role, content = item.get("type"), item.get("role"), item.get("content")
    if isinstance(content, str):
        content = [
            {"type": "input_text" if role != "assistant" else "output_text", "text": content}
        ]
    if isinstance(content, list) and role in _INPUT_ROLES:
        allowed = "'type' must be one of 'input_text', 'input_image', or 'input_file'"
        return str(role), _parts_text(_checked_parts(content, _INPUT_PARTS, allowed))
    if role == "assistant" and kind == "message":
        allowed = "'type' must be one of 'output_text' or 'refusal'"
        parts = _checked_parts(content if isinstance(content, list) else [], _OUTPUT_PARTS, allowed)
        return "assistant", _parts_text([p for p in parts if p.get("type") != "refusal"])
    if kind == "function_call" and _string(item, "arguments", "call_id", "name"):
        return "assistant", _tool_call(item["name"], item["arguments"])
    output = item.get("output")
    if (
        kind == "function_call_output"
        and _string(item, "call_id")
        and isinstance(output, str | list)
    ):
        return "user", _tool_response(output if isinstance(output, str) else _parts_text(output))
    if kind == "reasoning" and isinstance(item.get("summary"), list):
        reasoning = item.get("content")
        if not isinstance(reasoning, list) or not reasoning:
            raise BadRequest(
                "item['content'] is not an array"
                if not isinstance(reasoning, list)
                else "item['content'] is empty"
            )
        if not isinstance(reasoning[0], dict) or not isinstance(reasoning[0].get("text"), str):
            raise BadRequest("item['content']['text'] is not a string")
        return "assistant", f"<think>\n{reasoning[0]['text']}\n</think>\n"
    raise BadRequest("Cannot determine type of 'item'")


def responses_prompt(body: dict[str, Any]) -> Prompt:
    """OpenAI /v1/responses: instructions + input (a string or a list of items). System and
    developer messages count wherever they are, as Codex sends them."""
    if "input" not in body:
        raise BadRequest("'input' is required")
    if body.get("previous_response_id"):
        raise BadRequest("llama.cpp does not support 'previous_response_id'.")
    raw = body["input"]
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise BadRequest("'input' must be a string or array of objects")
    system = str(body.get("instructions") or "")
    parts: list[str] = []
    last_user = ""
    for item in raw:
        role, text = _response_item(item)
        if role in ("system", "developer") and not parts:
            system = f"{system}\n{text}" if system else text
            continue
        if parts and role == "assistant" and parts[-1].startswith(f"{START}assistant\n"):
            parts[-1] = parts[-1][: -len(f"{END}\n")] + text + f"{END}\n"  # one assistant turn
        else:
            parts.append(_turn("system" if role == "developer" else role, text))
        if role == "user":
            last_user = text
    return _finish([_system(system, _response_tools(body.get("tools"))), *parts], last_user)


def _response_tools(tools: Any) -> Any:
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array of objects")
    return (
        [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if tools
        else tools
    )

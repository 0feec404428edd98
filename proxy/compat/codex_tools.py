"""Codex's ``additional_tools`` input item, as tools llama-server offers and calls Codex dispatches.

With its default model name (no ``model`` line in its config), Codex sends its tools not in
``tools`` but in an input item ``{"type": "additional_tools", "role": "developer", "tools": [...]}``
of namespaces (``functions``, ``clock``, ``collaboration``) holding function tools and one
``custom`` tool (``exec``: free-form JavaScript, a Lark grammar). llama-server answers that item
400 "Cannot determine type of 'item'", so Codex failed on its first request. What maps:

- request: the item is removed; every function tool in it joins the request's ``tools`` under its
  own name (a name already taken is skipped: the first wins); a ``custom`` tool becomes a function
  tool with one string parameter ``input`` (llama-server has no free-form tools; its grammar is
  dropped, and the description kept); any other kind is dropped, as llama-server drops it.
  History items Codex sends back for custom tools, ``custom_tool_call`` and
  ``custom_tool_call_output``, become ``function_call`` (arguments ``{"input": ...}``) and
  ``function_call_output``, which llama-server renders.
- answer: a ``function_call`` of a custom tool goes back to Codex as the ``custom_tool_call`` it
  dispatches (``input`` read from the arguments), and one of a tool from a namespace other than
  ``functions`` carries its ``namespace`` (without it Codex answers "unsupported call"): in a
  non-stream body and in stream events (``output_item.added`` / ``.done``, ``response.completed``;
  a custom call's argument deltas are held back, its input arrives whole with ``.done``).

Top-level ``custom`` and ``namespace`` tools (the README's named-model config) are left as they
are: llama-server drops them with a warning, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

ITEM_TYPE = "additional_tools"
DEFAULT_NAMESPACE = "functions"  # Codex's own tools: called without a namespace
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's whole input text."}},
    "required": ["input"],
    "additionalProperties": False,
}
_DATA = b"data: "
_CUSTOM_ITEMS = frozenset({"custom_tool_call", "custom_tool_call_output"})
Flat = tuple[dict[str, Any], str | None, bool]  # a tool as a function, its namespace, custom


@dataclass(frozen=True)
class ToolMap:
    """The tools of a request's additional_tools: which are custom, which sit in a namespace."""

    custom: frozenset[str] = frozenset()
    namespaces: dict[str, str] = field(default_factory=dict)  # function name -> its namespace

    def __bool__(self) -> bool:
        return bool(self.custom or self.namespaces)


def has_additional_tools(body: dict[str, Any]) -> bool:
    items = body.get("input")
    return isinstance(items, list) and any(_is_additional(x) for x in items)


def mend_additional_tools(body: dict[str, Any]) -> dict[str, Any]:
    """The body with additional_tools moved into `tools` and custom-tool history items as
    function calls; the same object when it has none of them."""
    items = body.get("input")
    if not isinstance(items, list) or not any(_is_additional(x) or _is_custom(x) for x in items):
        return body
    existing = body.get("tools")
    tools: list[Any] = list(existing) if isinstance(existing, list) else []
    taken = {t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)}
    kept: list[Any] = []
    for item in items:
        if _is_additional(item):
            for tool, _, _ in _flattened(item.get("tools")):
                if tool["name"] not in taken:
                    taken.add(tool["name"])
                    tools.append(tool)
        else:
            kept.append(_history_item(item))
    mended = {**body, "input": kept}
    if tools:
        mended["tools"] = tools
    return mended


def tool_map(body: dict[str, Any]) -> ToolMap:
    """What the answer rewrite needs to know of the request's additional_tools."""
    custom: set[str] = set()
    namespaces: dict[str, str] = {}
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if not _is_additional(item):
            continue
        for tool, namespace, is_custom in _flattened(item.get("tools")):
            name = tool["name"]
            if is_custom:
                custom.add(name)
            elif namespace not in (None, DEFAULT_NAMESPACE):
                namespaces.setdefault(name, namespace)
    return ToolMap(frozenset(custom), namespaces)


def _is_additional(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == ITEM_TYPE


def _is_custom(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") in (
        "custom_tool_call",
        "custom_tool_call_output",
    )


def _flattened(tools: Any, namespace: str | None = None) -> list[Flat]:
    """Each function tool (custom ones as functions) with its namespace, and whether it is
    custom."""
    out: list[Flat] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        kind = tool.get("type")
        if kind == "namespace":
            out += _flattened(tool.get("tools"), tool["name"])
        elif kind == "function":
            out.append((tool, namespace, False))
        elif kind == "custom":
            out.append((_as_function(tool), namespace, True))
    return out


def _as_function(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool["name"],
        "description": str(tool.get("description") or ""),
        "strict": False,
        "parameters": _CUSTOM_PARAMETERS,
    }


def _history_item(item: Any) -> Any:
    if not _is_custom(item):
        return item
    if item["type"] == "custom_tool_call":
        text = item.get("input")
        arguments = json.dumps({"input": text if isinstance(text, str) else ""})
        call = {"type": "function_call", "call_id": item.get("call_id"), "name": item.get("name")}
        return {**call, "arguments": arguments}
    return {
        "type": "function_call_output",
        "call_id": item.get("call_id"),
        "output": item.get("output"),
    }


# --- the answer -------------------------------------------------------------------------------


def rewritten_item(item: Any, tools: ToolMap) -> Any:
    """One output item as Codex dispatches it: a custom tool's call, or a namespaced one."""
    if not isinstance(item, dict) or item.get("type") != "function_call":
        return item
    name = item.get("name")
    if isinstance(name, str) and name in tools.custom:
        out = {k: v for k, v in item.items() if k != "arguments"}
        out["type"] = "custom_tool_call"
        out["input"] = _custom_input(item.get("arguments"))
        return out
    namespace = tools.namespaces.get(name) if isinstance(name, str) else None
    return {**item, "namespace": namespace} if namespace else item


def _custom_input(arguments: Any) -> str:
    """The `input` of a custom tool's call, from the function call's JSON arguments (the raw
    arguments if they are not that object)."""
    if not isinstance(arguments, str):
        return ""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    value = parsed.get("input") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def rewritten_body(body: bytes, tools: ToolMap) -> bytes:
    """A non-stream Responses answer with its output items rewritten (as it came if none is)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    output = payload.get("output") if isinstance(payload, dict) else None
    if not isinstance(output, list):
        return body
    items = [rewritten_item(item, tools) for item in output]
    if all(a is b for a, b in zip(items, output, strict=True)):
        return body
    return orjson.dumps({**payload, "output": items})


class CodexToolEvents:
    """A Responses stream's events with the function calls rewritten (a ChunkRewriter)."""

    __slots__ = ("_held", "_pending", "_tools")

    def __init__(self, tools: ToolMap) -> None:
        self._tools = tools
        self._pending = bytearray()
        self._held: set[str] = set()  # ids of custom calls whose argument deltas are held back

    def feed(self, chunk: bytes) -> bytes:
        self._pending += chunk
        cut = self._pending.rfind(b"\n\n")
        if cut < 0:
            return b""
        done = bytes(self._pending[: cut + 2])
        del self._pending[: cut + 2]
        return b"".join(self._event(e + b"\n\n") for e in done.split(b"\n\n") if e)

    def flush(self) -> bytes:
        rest = bytes(self._pending)
        self._pending.clear()
        return rest

    def _event(self, event: bytes) -> bytes:
        at = event.find(_DATA)
        if at < 0 or b"function_call" not in event:  # one search for every text delta
            return event
        try:
            data = orjson.loads(event[at + len(_DATA) : -2])
        except orjson.JSONDecodeError:
            return event
        if not isinstance(data, dict):
            return event
        kind = data.get("type")
        if kind == "response.function_call_arguments.delta":
            item_id = data.get("item_id")
            return b"" if isinstance(item_id, str) and item_id in self._held else event
        changed = self._changed(kind, data)
        if changed is None:
            return event
        return b"".join((event[: at + len(_DATA)], orjson.dumps(changed), b"\n\n"))

    def _changed(self, kind: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = data.get("item")
            new = rewritten_item(item, self._tools)
            if new is item:
                return None
            if isinstance(new, dict) and new.get("type") == "custom_tool_call":
                self._held.add(str(new.get("id")))
            return {**data, "item": new}
        response = data.get("response")
        if kind != "response.completed" or not isinstance(response, dict):
            return None
        output = response.get("output")
        if not isinstance(output, list):
            return None
        items = [rewritten_item(item, self._tools) for item in output]
        if all(a is b for a, b in zip(items, output, strict=True)):
            return None
        new_response: dict[str, Any] = {**response, "output": items}
        return {**data, "response": new_response}

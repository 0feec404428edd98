"""Responses input items llama-server cannot place, in the forms OpenAI accepts.

- An item with a role and no ``type``: OpenAI reads it as a message; llama-server's converter
  takes user/system/developer ones so, but answers 400 "Cannot determine type of 'item'" for an
  assistant one. The AI SDK's ``@ai-sdk/openai`` provider (opencode, Kilo Code, Vercel AI SDK
  agents) sends every earlier answer that way, so each second turn failed. The mend adds
  ``"type": "message"``.
- A reasoning item without text content (``{"type": "reasoning", "summary": [], "content": []}``
  or no content, as the same provider sends back an all-reasoning answer, which a Qwen3.5/3.6 first
  turn often is): llama-server answers 400 ("item['content'] is not an array" / "is empty").
  Such an item carries nothing to render: it is dropped.

Each changes only items llama-server would refuse, so a body it accepts never changes.

- An ``item_reference`` (``{"type": "item_reference", "id": "..."}``), an item of an earlier
  response named by its id: what ``@ai-sdk/openai`` sends by default for its earlier turns, since
  OpenAI stores every response. llama-server stores none, so no mend can fill it in; it answered
  a bare 400 "Cannot determine type of 'item'". ``check_item_references`` refuses it with a 400
  that says what to do instead.
"""

from __future__ import annotations

from typing import Any

from proxy.compat.outcome import Refused

ITEM_REFERENCE_ADVICE = (
    "llama-server stores no responses: send the full items, or `store: false` (with the AI "
    "SDK: providerOptions.openai.store = false), so that earlier turns come whole"
)


def check_item_references(body: dict[str, Any]) -> None:
    """Raises Refused, naming the first one, when ``input`` holds an item_reference."""
    items = body.get("input")
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            named = item.get("id")
            which = f" (id {named[:80]!r})" if isinstance(named, str) else ""
            raise Refused(f"input[{index}] is an item_reference{which}: {ITEM_REFERENCE_ADVICE}")


def mend_input_items(body: dict[str, Any]) -> dict[str, Any]:
    """The body with typed message items and without empty reasoning items; the same object
    when none needs it."""
    items = body.get("input")
    if not isinstance(items, list) or not any(_untyped(x) or _empty_reasoning(x) for x in items):
        return body
    mended = [
        {**item, "type": "message"} if _untyped(item) else item
        for item in items
        if not _empty_reasoning(item)
    ]
    return {**body, "input": mended}


def _untyped(item: Any) -> bool:
    return isinstance(item, dict) and "role" in item and "type" not in item


def _empty_reasoning(item: Any) -> bool:
    """A reasoning item llama-server refuses: no content list whose first part has text."""
    if not isinstance(item, dict) or item.get("type") != "reasoning":
        return False
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return True
    first = content[0]
    return not (isinstance(first, dict) and isinstance(first.get("text"), str))

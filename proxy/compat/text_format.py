"""Structured output asked through Responses' ``text.format``: the form llama-server enforces.

llama-server's Responses converter copies the body and reads its chat fields: it ignores
``text.format`` (a 200 with free text, so pydantic-ai and LangChain fail validation with no hint
why), but it enforces a top-level ``response_format`` as the chat route does. The mend puts the
format there: ``json_schema`` as ``{"type": "json_schema", "json_schema": {name, schema, strict,
description}}``, ``json_object`` as it is. A body that already has a ``response_format`` keeps it.
"""

from __future__ import annotations

from typing import Any

from proxy.compat.outcome import Refused

_SCHEMA_KEYS = ("name", "schema", "strict", "description")


def mend_text_format(body: dict[str, Any]) -> dict[str, Any]:
    """The body with `response_format` from `text.format`; the same object when there is none
    to translate. Raises Refused for a json_schema format without a schema object."""
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or "response_format" in body:
        return body
    kind = fmt.get("type")
    if kind == "json_object":
        return {**body, "response_format": {"type": "json_object"}}
    if kind != "json_schema":
        return body  # "text": nothing to enforce
    if not isinstance(fmt.get("schema"), dict):
        raise Refused("text.format of type json_schema needs a 'schema' object")
    schema = {key: fmt[key] for key in _SCHEMA_KEYS if key in fmt}
    return {**body, "response_format": {"type": "json_schema", "json_schema": schema}}

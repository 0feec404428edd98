"""Structured output asked through Messages' ``output_config.format``: a 400, never a silent 200.

llama-server's Anthropic converter builds a new body from a fixed list of fields; the format is
not among them, nor is any other field that could carry a schema or grammar (``response_format``,
``json_schema``), so the answer is free text. A client that asked for JSON would get a 200 it
cannot parse and no hint why. The nearest form llama-server enforces is the chat route's
``response_format`` (or Responses' ``text.format``, which the proxy mends), so the proxy answers
400 naming the field and those routes. ``output_config`` without a format (Claude Code's
``{"effort": ...}``) passes as it is.
"""

from __future__ import annotations

from typing import Any

from proxy.compat.outcome import Refused

MESSAGE = (
    "output_config.format is not supported here: llama-server does not pass it on from "
    "/v1/messages, so the answer would not follow the schema. Ask for structured output with "
    "response_format on /v1/chat/completions or text.format on /v1/responses."
)


def check_output_format(body: dict[str, Any]) -> None:
    """Raises Refused when the body asks for a structured output format."""
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("format") is not None:
        raise Refused(MESSAGE)
